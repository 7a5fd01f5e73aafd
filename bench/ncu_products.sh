#!/bin/bash
# ncu_products.sh — Nsight Compute memory metrics of the skinny products (sk_kernel) in eager c=N decode steps:
# per launch shape, duration, DRAM bytes read, L2->SM bytes and the DRAM / L2 throughput as % of peak. Answers
# "is this product bound by DRAM or by the L2 -> SM traffic of its x re-reads?" (bench/RESULTS.md session 23).
#   BUILD_DIR=build-gpu bench/ncu_products.sh [CONC] [ENV=VALUE ...]   (run through tools/gpu_run.sh shell)
# KERNELS (default sk_kernel: an ncu name regex), LAUNCHES (default 600; ~0.5 s of device time each)
set -u -o pipefail
build=${BUILD_DIR:-build-gpu}
conc=${1:-32}
[ $# -gt 0 ] && shift
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-e2b}
if [ ! -f "$ckpt/config.json" ]; then
    python3 tools/gen_gemma4_bench_ckpt.py --shape e2b --out "$ckpt" >/tmp/ncu-ckpt.log 2>&1 ||
        { tail /tmp/ncu-ckpt.log; exit 1; }
fi
cfg=/tmp/ncu-products.ini
sed -e "s#^dir = .*#dir = $(pwd)/$build/plugins#" bench/gpu-bench.ini |
    awk '{print} /^\[scheduler\]/{print "graphs = false"}' >"$cfg"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
csv=${OUT:-/tmp}/ncu-products-c$conc${1:+-$(echo "$*" | tr ' =/' '_-_')}.csv
env "$@" "$ncu" --kernel-name "regex:${KERNELS:-sk_kernel}" --launch-skip 0 --launch-count "${LAUNCHES:-600}" --csv --print-units base \
    --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed \
    --log-file "$csv" "$build/host/berth" bench --config "$cfg" --model "$ckpt" --concurrency "$conc" \
    --prompt-len 512 --gen-len 3 --warmup once >/tmp/ncu-products.out 2>&1 || { tail /tmp/ncu-products.out; }
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
print(f"{'kernel':44s} {'grid':>12s} {'n':>4s} {'us':>7s} {'DRAM MB':>8s} {'L2->SM MB':>9s} {'DRAM TB/s':>9s} {'DRAM%':>6s} {'L2%':>5s} {'L1%':>5s}")
for (name, grid), ms in sorted(agg.items(), key=lambda kv: -sum(m['gpu__time_duration.sum'] for m in kv[1])):
    med = lambda k: sorted(m[k] for m in ms)[len(ms) // 2]
    us = med('gpu__time_duration.sum') / 1e3
    dr = med('dram__bytes_read.sum') / 1e6
    x = med('l1tex__m_xbar2l1tex_read_bytes.sum') / 1e6
    print(f"{name[:44]:44s} {grid:>12s} {len(ms):4d} {us:7.1f} {dr:8.1f} {x:9.1f} {dr / us:9.2f} "
          f"{med('dram__throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
          f"{med('lts__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f} "
          f"{med('l1tex__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}")
PY
