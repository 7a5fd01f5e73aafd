#!/bin/bash
# ab_plugins.sh — same-call A/B of plugin builds with `berth bench`: the same host binary runs once per plugin
# folder per round, rounds interleaved, so that drift between device calls does not decide the comparison (only
# figures from one call compare; bench/RESULTS.md). The companion of ab_env.sh, which compares switches of one
# build; this compares builds (e.g. a branch's CUDA plugin against main's), as session 16 did by hand.
#
#   bench/ab_plugins.sh [-r ROUNDS] [-c CONCURRENCY] [-k] FOLDER ...
#
# A FOLDER holds the plugins of one variant (the backend and the model plugin: berth loads what it finds there,
# configured by the template's other sections). Prints one line per run: "round R | FOLDER | C tok/s C tok/s ..."
# (decode tok/s per concurrency level). With -k each run also records a kernel trace (bench/ktrace.c, through
# CUPTI) to $OUT/ktrace-rR-N.csv (N: the folder's position), summarised beside it by bench/ktrace_summary.py.
#
# Environment: BUILD_DIR (default build; its host/berth runs every variant, and with -k its bench/ktrace library),
# BENCH_CKPT (default /tmp/berth-gemma4-e2b; made with tools/gen_gemma4_bench_ckpt.py --shape e2b when absent),
# TEMPLATE (default bench/gpu-bench.ini: its [plugins] dir is replaced per folder), PROMPT_LEN (512), GEN_LEN
# (128), OUT (default /tmp). Relative paths are taken from the repository root. A run that fails or prints fewer
# levels shows FAILED.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
rounds=2
conc=1,8,32
trace=0
while getopts "r:c:k" o; do
    case $o in
    r) rounds=$OPTARG ;;
    c) conc=$OPTARG ;;
    k) trace=1 ;;
    *) sed -n 2,17p "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { sed -n 2,17p "$0" >&2; exit 2; }
abs() { case $1 in /*) echo "$1" ;; *) echo "$root/$1" ;; esac; }
build=$(abs "${BUILD_DIR:-build}")
template=$(abs "${TEMPLATE:-bench/gpu-bench.ini}")
out=$(abs "${OUT:-/tmp}")
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
if [ ! -f "$ckpt/config.json" ]; then
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >/tmp/ab_plugins-ckpt.log 2>&1 ||
        { tail /tmp/ab_plugins-ckpt.log; exit 1; }
fi
cupti=
if [ "$trace" = 1 ]; then
    [ -f "$build/bench/libberth_ktrace.so" ] || { echo "ab_plugins.sh: no $build/bench/libberth_ktrace.so" >&2; exit 1; }
    lib=$(find /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)
    [ -n "$lib" ] || { echo "ab_plugins.sh: -k needs CUPTI (libcupti.so under /usr/local/cuda)" >&2; exit 1; }
    cupti=$(dirname "$lib")
fi
# one config per folder, the template's [plugins] dir pointed at it
cfgs=()
i=0
for f in "$@"; do
    i=$((i + 1))
    d=$(abs "$f")
    [ -d "$d" ] || { echo "ab_plugins.sh: $f: not a folder" >&2; exit 1; }
    cfg=/tmp/ab_plugins-$i.ini
    sed -e "s#^dir = .*#dir = $d#" "$template" >"$cfg"
    grep -q "^dir = $d\$" "$cfg" || { echo "ab_plugins.sh: cannot point $cfg at $d" >&2; exit 1; }
    cfgs+=("$cfg")
done
levels=$(echo "$conc" | tr ',' '\n' | grep -c .)
for r in $(seq 1 "$rounds"); do
    i=0
    for f in "$@"; do
        i=$((i + 1))
        pre=()
        if [ "$trace" = 1 ]; then
            pre=(env CUDA_INJECTION64_PATH="$build/bench/libberth_ktrace.so" KTRACE_OUT="$out/ktrace-r$r-$i.csv"
                LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$cupti")
        fi
        line=$(${pre[@]+"${pre[@]}"} "$build/host/berth" bench --config "${cfgs[$((i - 1))]}" --model "$ckpt" \
            --prompt-len "${PROMPT_LEN:-512}" --gen-len "${GEN_LEN:-128}" --concurrency "$conc" 2>&1 |
            awk '$1 ~ /^[0-9]+$/ && NF > 8 {printf "%s %s ", $1, $NF; n++} END {exit n == 0}')
        status=$?
        rows=$(echo "$line" | awk '{print NF / 2}')
        [ "$status" -eq 0 ] && [ "$rows" = "$levels" ] || line="FAILED (${line:-no rows})"
        echo "round $r | $f | $line"
        if [ "$trace" = 1 ] && [ -f "$out/ktrace-r$r-$i.csv" ]; then
            python3 bench/ktrace_summary.py "$out/ktrace-r$r-$i.csv" --top 40 >"$out/ktrace-r$r-$i.txt" 2>&1
        fi
    done
done
