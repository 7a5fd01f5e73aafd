#!/bin/bash
# ncu_decode.sh — Nsight Compute on the kernels of eager decode steps at CONC sequences (prompt 512, E2B-shaped
# checkpoint, graphs off so ncu sees each launch), one of three views (bench/RESULTS.md session 23):
#   bytes     per launch shape (kernel, grid), medians: duration, DRAM bytes read, L2 -> SM bytes, DRAM TB/s and
#             DRAM / L2 / L1 throughput as % of peak — bound by DRAM, by L2 traffic, or by neither?
#   stalls    per launch shape, medians: issue-slot use, warps per scheduler and the per-issue stall ratios (cycles
#             a warp spends in each state per instruction issued; they sum to the CPI), the seven largest
#   sections  ncu's speed-of-light, scheduler, warp-state and memory sections of each launch, filtered to the lines
#             that say what bounds it (~5 s per launch: 18 replay passes)
#
#   [KERNELS=REGEX] [SKIP=N] [LAUNCHES=N] [CONC=32] [LINES_MAX=80] BUILD_DIR=build-gpu \
#       bench/ncu_decode.sh bytes|stalls|sections [ENV=VALUE ...]          (through tools/gpu_run.sh shell)
# KERNELS: an ncu --kernel-name regex (default sk_kernel, the skinny products); LAUNCHES: how many matching launches
# are profiled (default 600 for bytes, 40 for stalls, 2 for sections); ENV=VALUE: the plugin's switches for the run.
# bytes and stalls leave their CSV in $OUT (default /tmp).
set -u -o pipefail
mode=${1:-}
case $mode in
    bytes) launches=600 ;;
    stalls) launches=40 ;;
    sections) launches=2 ;;
    *) sed -n 2,16p "$0" >&2; exit 2 ;;
esac
shift
build=${BUILD_DIR:-build-gpu}
conc=${CONC:-32}
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
. bench/lib.sh
bench_ckpt_ready "$ckpt" /tmp/ncu-ckpt.log || exit 1
cfg=/tmp/ncu-decode.ini
bench_config_nographs <(sed -e "s#^dir = .*#dir = $(pwd)/$build/plugins#" bench/gpu-bench.ini) "$cfg" || exit 1
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
# ncu [ARGS...] over `berth bench` with the plugin switches given on the command line
run_ncu() {
    env "$@" "$ncu" --kernel-name "regex:${KERNELS:-sk_kernel}" --launch-skip "${SKIP:-0}" \
        --launch-count "${LAUNCHES:-$launches}" --cache-control none --clock-control none "${ncu_args[@]}" \
        "$build/host/berth" bench --config "$cfg" --model "$ckpt" --concurrency "$conc" --prompt-len 512 \
        --gen-len 3 --warmup once
}
if [ "$mode" = sections ]; then
    ncu_args=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis)
    run_ncu "$@" 2>&1 | grep -vE '^\s*$|----' |
        grep -E '\(.*\)x\(|Duration|Throughput|Stall|stall|Warp Cycles|Issued|Eligible|Active Warps|Busy|Hit Rate' |
        head -n "${LINES_MAX:-80}"
    exit 0
fi
if [ "$mode" = bytes ]; then
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum
    metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed
    metrics=$metrics,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
else
    metrics=gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
    metrics=$metrics,smsp__warps_active.avg.per_cycle_active
    for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
        lg_throttle dispatch_stall membar sleeping tex_throttle no_instruction drain branch_resolving imc_miss misc; do
        metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
    done
fi
csv=${OUT:-/tmp}/ncu-$mode-c$conc${1:+-$(echo "$*" | tr ' =/' '_-_')}.csv
ncu_args=(--csv --print-units base --metrics "$metrics" --log-file "$csv")
run_ncu "$@" >/tmp/ncu-decode.out 2>&1 || tail /tmp/ncu-decode.out
python3 - "$csv" "$mode" <<'PY'
import csv, re, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
per = collections.defaultdict(dict)  # (launch ID, kernel, grid) -> {metric: value}
for r in csv.DictReader(rows):
    key = (r['ID'], re.sub(r'\(.*', '', r['Kernel Name'].replace('void ', '')), r['Grid Size'])
    per[key][r['Metric Name']] = float(r['Metric Value'].replace(',', ''))
shapes = collections.defaultdict(list)  # (kernel, grid) -> one metric dict per launch
for (_, name, grid), m in per.items():
    shapes[(name, grid)].append(m)
if sys.argv[2] == 'bytes':
    print(f"{'kernel':44s} {'grid':>12s} {'n':>4s} {'us':>7s} {'DRAM MB':>8s} {'L2->SM MB':>9s} {'DRAM TB/s':>9s} "
          f"{'DRAM%':>6s} {'L2%':>5s} {'L1%':>5s}")
for (name, grid), ms in sorted(shapes.items(), key=lambda kv: -sum(m['gpu__time_duration.sum'] for m in kv[1])):
    med = lambda k: sorted(m.get(k, 0.0) for m in ms)[len(ms) // 2]
    us = med('gpu__time_duration.sum') / 1e3
    if sys.argv[2] == 'bytes':
        dr = med('dram__bytes_read.sum') / 1e6
        x = med('l1tex__m_xbar2l1tex_read_bytes.sum') / 1e6
        print(f"{name[:44]:44s} {grid:>12s} {len(ms):4d} {us:7.1f} {dr:8.1f} {x:9.1f} {dr / us:9.2f} "
              f"{med('dram__throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
              f"{med('lts__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
              f"{med('l1tex__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}")
    else:
        st = {k.split('stalled_')[1].split('_per_issue')[0]: med(k) for k in ms[0] if 'stalled_' in k}
        top = sorted(st.items(), key=lambda kv: -kv[1])[:7]
        print(f"{name[:34]:34s} {grid:>12s} n={len(ms):3d} {us:7.1f} us  "
              f"issue {med('smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}%  "
              f"warps/sched {med('smsp__warps_active.avg.per_cycle_active'):4.2f}  CPI {sum(st.values()):5.2f}: " +
              ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
