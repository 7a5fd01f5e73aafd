# bench/lib.sh — helpers the GPU benchmark scripts share (sourced, not run; bash).
#
#   bench_ckpt_ready CKPT LOG   make the random-weight E2B checkpoint in CKPT unless it holds one (config.json);
#                               the generator's output goes to LOG, whose tail is printed on failure (status 1)
#   bench_config_nographs SRC DST   DST = the INI file SRC with `graphs = false` in its [scheduler] section (the
#                               section is appended when SRC has none): every launch eager, for profilers that
#                               time kernels one by one

bench_ckpt_ready() {
    local ckpt=$1 log=$2
    [ -f "$ckpt/config.json" ] && return 0
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >"$log" 2>&1 && return 0
    tail "$log" >&2
    return 1
}

bench_config_nographs() {
    local src=$1 dst=$2
    awk '{print} /^\[scheduler\]/{print "graphs = false"}' "$src" >"$dst" || return 1
    grep -q '^\[scheduler\]' "$dst" || printf '[scheduler]\ngraphs = false\n' >>"$dst"
}
