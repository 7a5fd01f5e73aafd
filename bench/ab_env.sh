#!/bin/bash
# ab_env.sh — same-call A/B of environment switches and of plugin builds with `berth bench` on the GPU machine:
# each setting runs once per round, rounds interleaved, so that drift between calls does not decide the comparison
# (only figures from one call compare; bench/RESULTS.md).
#
#   bench/ab_env.sh [-r ROUNDS] [-c CONCURRENCY] [-k] [-l] [SETTING ...]
#
# A SETTING is a space-separated list of NAME=VALUE assignments for that run ('' or 'default': none), e.g.
#   bench/ab_env.sh -r 2 -c 1,8,32 default BERTH_CUDA_GEMV_EARLY_MIB=16 'BERTH_CUDA_PDL=0 BERTH_CUDA_XPRE=1'
# PLUGINS=DIR is not an environment variable: that run loads its plugins from DIR (another build's CUDA plugin
# beside the Gemma 4 plugin; a DIR/*.so.xz is unpacked first, tools/gpu_ab_plugin.sh makes such folders) instead of
# BUILD_DIR/plugins, e.g. `default PLUGINS=/tmp/branch`. Nor is ARGS=A,B,...: more `berth bench` arguments for that
# run, commas for spaces, e.g. `ARGS=--warmup,once`. Nor is INI=KEY=VALUE: that run's config with the line
# "KEY = ..." set to VALUE (an existing key of bench/gpu-bench.ini or BERTH_CONFIG), e.g. `INI=max_batch_tokens=8192`.
# Prints one line per run: "round R | SETTING | C tok/s C tok/s ..." (decode tok/s per concurrency level). With -k
# each run also records a kernel trace (bench/ktrace.c, through CUPTI) to $OUT/ktrace-rR-N.csv (N: the setting's
# position), summarised beside it by bench/ktrace_summary.py. With -l each run's whole output (the backend's log
# included, e.g. BERTH_CUDA_ATT_PROF=graph's stamps, for bench/stamps_summary.py) is kept in $OUT/ab-rR-N.log.
#
# Environment: BUILD_DIR (default build; host/berth and plugins/ prebuilt, with -k bench/libberth_ktrace.so),
# BENCH_CKPT (default /tmp/berth-gemma4-e2b; made with tools/gen_gemma4_bench_ckpt.py --shape e2b when absent),
# BERTH_CONFIG (default: bench/gpu-bench.ini pointed at BUILD_DIR/plugins; with PLUGINS=DIR, that file pointed at
# DIR), PROMPT_LEN (512), GEN_LEN (128), OUT (default /tmp); relative paths are taken from the repository root.
# LD_LIBRARY_PATH as set. A run that fails or prints fewer levels shows FAILED.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
rounds=2
conc=1,8,32
trace=0
keep=0
while getopts "r:c:kl" o; do
    case $o in
    r) rounds=$OPTARG ;;
    c) conc=$OPTARG ;;
    k) trace=1 ;;
    l) keep=1 ;;
    *) sed -n 2,22p "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- default
abs() { case $1 in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }
build=$(abs "${BUILD_DIR:-build}")
out=$(abs "${OUT:-/tmp}")
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
. bench/lib.sh
bench_ckpt_ready "$ckpt" /tmp/ab_env-ckpt.log || exit 1
# config_for N DIR: a config like the template with its [plugins] dir pointed at DIR (file name by position N)
config_for() {
    local c=/tmp/ab_env-bench-$1.ini
    sed -e "s#^dir = .*#dir = $2#" "$(abs "${BERTH_CONFIG:-bench/gpu-bench.ini}")" >"$c"
    grep -q "^dir = $2\$" "$c" || { echo "ab_env.sh: cannot point $c at $2" >&2; return 1; }
    echo "$c"
}
cupti=
if [ "$trace" = 1 ]; then
    [ -f "$build/bench/libberth_ktrace.so" ] || { echo "ab_env.sh: no $build/bench/libberth_ktrace.so" >&2; exit 1; }
    lib=$(find /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)
    [ -n "$lib" ] || { echo "ab_env.sh: -k needs CUPTI (libcupti.so under /usr/local/cuda)" >&2; exit 1; }
    cupti=$(dirname "$lib")
fi
# per setting: its environment assignments and its config (BERTH_CONFIG as given unless PLUGINS= names a folder)
envs_of=()
args_of=()
cfgs=()
i=0
for setting in "$@"; do
    i=$((i + 1))
    words=()
    [ "$setting" = default ] || read -r -a words <<<"$setting"
    plugins=
    envs=
    bargs=
    ini=
    for w in ${words[@]+"${words[@]}"}; do
        case $w in
        PLUGINS=*) plugins=$(abs "${w#PLUGINS=}") ;;
        ARGS=*) bargs="$bargs $(echo "${w#ARGS=}" | tr ',' ' ')" ;;
        INI=*) ini="$ini ${w#INI=}" ;;
        *) envs="$envs $w" ;;
        esac
    done
    if [ -n "$plugins" ]; then
        [ -d "$plugins" ] || { echo "ab_env.sh: $plugins: not a folder" >&2; exit 1; }
        # a plugin carried packed (tools/gpu_ab_plugin.sh): unpack it beside its .xz, every time (the carried folder
        # replaces the machine's copy at each call, so an unpacked .so from an earlier call may be another build's)
        for x in "$plugins"/*.so.xz; do
            [ -e "$x" ] || continue
            xz -dkf "$x" || { echo "ab_env.sh: cannot unpack $x" >&2; exit 1; }
        done
        cfg=$(config_for "$i" "$plugins") || exit 1
    elif [ -n "${BERTH_CONFIG:-}" ]; then
        cfg=$(abs "$BERTH_CONFIG")
    else
        cfg=$(config_for 0 "$build/plugins") || exit 1
    fi
    for kv in $ini; do
        key=${kv%%=*}
        grep -q "^$key = " "$cfg" || { echo "ab_env.sh: $cfg has no '$key = ' line" >&2; exit 1; }
        sed -e "s#^$key = .*#$key = ${kv#*=}#" "$cfg" >"/tmp/ab_env-ini-$i.tmp" &&
            mv "/tmp/ab_env-ini-$i.tmp" "/tmp/ab_env-ini-$i.ini"
        cfg=/tmp/ab_env-ini-$i.ini
    done
    envs_of+=("$envs")
    args_of+=("$bargs")
    cfgs+=("$cfg")
done
levels=$(echo "$conc" | tr ',' '\n' | grep -c .)
for r in $(seq 1 "$rounds"); do
    i=0
    for setting in "$@"; do
        i=$((i + 1))
        read -r -a envs <<<"${envs_of[$((i - 1))]}"
        read -r -a bargs <<<"${args_of[$((i - 1))]}"
        if [ "$trace" = 1 ]; then
            envs+=(CUDA_INJECTION64_PATH="$build/bench/libberth_ktrace.so" KTRACE_OUT="$out/ktrace-r$r-$i.csv"
                LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$cupti")
        fi
        log=/dev/null
        [ "$keep" = 1 ] && log="$out/ab-r$r-$i.log"
        line=$(env ${envs[@]+"${envs[@]}"} "$build/host/berth" bench --config "${cfgs[$((i - 1))]}" --model "$ckpt" \
            --prompt-len "${PROMPT_LEN:-512}" --gen-len "${GEN_LEN:-128}" --concurrency "$conc" ${bargs[@]+"${bargs[@]}"} 2>&1 | tee "$log" |
            awk '$1 ~ /^[0-9]+$/ && NF > 8 {printf "%s %s ", $1, $NF; n++} END {exit n == 0}')
        status=$?
        rows=$(echo "$line" | awk '{print NF / 2}')
        [ "$status" -eq 0 ] && [ "$rows" = "$levels" ] || line="FAILED (${line:-no rows})"
        echo "round $r | ${setting:-default} | $line"
        if [ "$trace" = 1 ] && [ -f "$out/ktrace-r$r-$i.csv" ]; then
            python3 bench/ktrace_summary.py "$out/ktrace-r$r-$i.csv" --top 40 >"$out/ktrace-r$r-$i.txt" 2>&1
        fi
    done
done
