#!/bin/bash
# ncu_stalls.sh — Nsight Compute's speed-of-light, scheduler, warp-state and memory sections of a few launches of
# one kernel in eager decode steps at CONC sequences (prompt 512), filtered to the lines that say what bounds it:
# throughputs against peak, issue rate, eligible warps, hit rates (bench/RESULTS.md session 23).
#   KERNELS=REGEX [SKIP=N] [LAUNCHES=N] [LINES_MAX=N] [CONC=32] BUILD_DIR=build-gpu bench/ncu_stalls.sh [ENV=VALUE ...]
# (run through tools/gpu_run.sh shell; ~5 s per launch profiled, 18 replay passes each)
set -u -o pipefail
build=${BUILD_DIR:-build-gpu}
: "${KERNELS:?name the kernels: KERNELS=REGEX (an ncu --kernel-name regex)}"
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
if [ ! -f "$ckpt/config.json" ]; then
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >/tmp/ncu-ckpt.log 2>&1 ||
        { tail /tmp/ncu-ckpt.log; exit 1; }
fi
cfg=/tmp/ncu-stalls.ini
sed -e "s#^dir = .*#dir = $(pwd)/$build/plugins#" bench/gpu-bench.ini |
    awk '{print} /^\[scheduler\]/{print "graphs = false"}' >"$cfg"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
env "$@" "$ncu" --kernel-name "regex:$KERNELS" --launch-skip "${SKIP:-0}" --launch-count "${LAUNCHES:-2}" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --cache-control none --clock-control none "$build/host/berth" bench --config "$cfg" --model "$ckpt" \
    --concurrency "${CONC:-32}" --prompt-len 512 --gen-len 3 --warmup once 2>&1 |
    grep -vE '^\s*$|----' |
    grep -E '\(.*\)x\(|Duration|Throughput|Stall|stall|Warp Cycles|Issued|Eligible|Active Warps|Busy|Hit Rate' |
    head -n "${LINES_MAX:-80}"
