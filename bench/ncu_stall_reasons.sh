#!/bin/bash
# ncu_stall_reasons.sh — where the warps of each skinny launch shape wait: Nsight Compute's per-issue stall ratios
# (cycles a warp spends in each state per instruction issued; they sum to the CPI) for LAUNCHES launches matching
# KERNELS after SKIP, eager decode at CONC sequences, medians per (kernel, grid) (bench/RESULTS.md session 23).
#   [KERNELS=sk_kernel] [SKIP=0] [LAUNCHES=40] [CONC=32] BUILD_DIR=build-gpu bench/ncu_stall_reasons.sh [ENV=VALUE ...]
set -u -o pipefail
build=${BUILD_DIR:-build-gpu}
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
if [ ! -f "$ckpt/config.json" ]; then
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >/tmp/ncu-ckpt.log 2>&1 ||
        { tail /tmp/ncu-ckpt.log; exit 1; }
fi
cfg=/tmp/ncu-reasons.ini
sed -e "s#^dir = .*#dir = $(pwd)/$build/plugins#" bench/gpu-bench.ini |
    awk '{print} /^\[scheduler\]/{print "graphs = false"}' >"$cfg"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
reasons="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected
lg_throttle dispatch_stall membar sleeping tex_throttle no_instruction drain branch_resolving imc_miss misc"
metrics=gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active
for r in $reasons; do metrics=$metrics,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
csv=/tmp/ncu-reasons.csv
env "$@" "$ncu" --kernel-name "regex:${KERNELS:-sk_kernel}" --launch-skip "${SKIP:-0}" --launch-count "${LAUNCHES:-40}" \
    --csv --print-units base --cache-control none --clock-control none --metrics "$metrics" --log-file "$csv" \
    "$build/host/berth" bench --config "$cfg" --model "$ckpt" --concurrency "${CONC:-32}" --prompt-len 512 \
    --gen-len 3 --warmup once >/tmp/ncu-reasons.out 2>&1 || tail /tmp/ncu-reasons.out
python3 - "$csv" <<'PY'
import csv, re, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
per = collections.defaultdict(dict)
for r in csv.DictReader(rows):
    key = (r['ID'], re.sub(r'\(.*', '', r['Kernel Name'].replace('void ', '')), r['Grid Size'])
    per[key][r['Metric Name']] = float(r['Metric Value'].replace(',', ''))
agg = collections.defaultdict(list)
for (i, name, grid), m in per.items():
    agg[(name, grid)].append(m)
for (name, grid), ms in sorted(agg.items(), key=lambda kv: -sum(m['gpu__time_duration.sum'] for m in kv[1])):
    med = lambda k: sorted(m.get(k, 0.0) for m in ms)[len(ms) // 2]
    st = {k.split('stalled_')[1].split('_per_issue')[0]: med(k) for k in ms[0] if 'stalled_' in k}
    top = sorted(st.items(), key=lambda kv: -kv[1])[:7]
    print(f"{name[:34]:34s} {grid:>12s} n={len(ms):3d} {med('gpu__time_duration.sum') / 1e3:7.1f} us  "
          f"issue {med('smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}%  "
          f"warps/sched {med('smsp__warps_active.avg.per_cycle_active'):4.2f}  CPI {sum(st.values()):5.2f}: " +
          ", ".join(f"{k} {v:.2f}" for k, v in top))
PY
