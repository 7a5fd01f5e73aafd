#!/bin/bash
# ab_env.sh — same-call A/B of environment switches with `berth bench` on the GPU machine: each setting runs once
# per round, rounds interleaved, so that drift between calls does not decide the comparison (only figures from one
# call compare; bench/RESULTS.md).
#
#   bench/ab_env.sh [-r ROUNDS] [-c CONCURRENCY] [SETTING ...]
#
# A SETTING is a space-separated list of NAME=VALUE assignments for that run ('' or 'default': none), e.g.
#   bench/ab_env.sh -r 2 -c 1,8,32 default BERTH_CUDA_GEMV_EARLY_MIB=16 'BERTH_CUDA_PDL=0 BERTH_CUDA_XPRE=1'
# prints one line per run: "round R | SETTING | C tok/s C tok/s ..." (decode tok/s per concurrency level).
#
# Environment: BUILD_DIR (default build; host/berth and plugins/ prebuilt), BENCH_CKPT (default
# /tmp/berth-gemma4-e2b; made with tools/gen_gemma4_bench_ckpt.py --shape e2b when absent), BERTH_CONFIG (default:
# bench/gpu-bench.ini pointed at BUILD_DIR/plugins), PROMPT_LEN (512), GEN_LEN (128); relative paths are taken
# from the repository root. LD_LIBRARY_PATH as set. A run that fails or prints fewer levels shows FAILED.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
rounds=2
conc=1,8,32
while getopts "r:c:" o; do
    case $o in
    r) rounds=$OPTARG ;;
    c) conc=$OPTARG ;;
    *) sed -n 2,14p "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- default
build=${BUILD_DIR:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
if [ ! -f "$ckpt/config.json" ]; then
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >/tmp/ab_env-ckpt.log 2>&1 ||
        { tail /tmp/ab_env-ckpt.log; exit 1; }
fi
cfg=${BERTH_CONFIG:-}
if [ -z "$cfg" ]; then
    cfg=/tmp/ab_env-bench.ini
    sed -e "s#^dir = .*#dir = $build/plugins#" bench/gpu-bench.ini >"$cfg"
    grep -q "^dir = $build/plugins\$" "$cfg" || { echo "ab_env.sh: cannot point $cfg at $build/plugins" >&2; exit 1; }
fi
levels=$(echo "$conc" | tr ',' '\n' | grep -c .)
for r in $(seq 1 "$rounds"); do
    for setting in "$@"; do
        envs=()
        [ "$setting" = default ] || read -r -a envs <<<"$setting"
        line=$(env ${envs[@]+"${envs[@]}"} "$build/host/berth" bench --config "$cfg" --model "$ckpt" \
            --prompt-len "${PROMPT_LEN:-512}" --gen-len "${GEN_LEN:-128}" --concurrency "$conc" 2>&1 |
            awk '$1 ~ /^[0-9]+$/ && NF > 8 {printf "%s %s ", $1, $NF; n++} END {exit n == 0}')
        status=$?
        rows=$(echo "$line" | awk '{print NF / 2}')
        [ "$status" -eq 0 ] && [ "$rows" = "$levels" ] || line="FAILED (${line:-no rows})"
        echo "round $r | ${setting:-default} | $line"
    done
done
