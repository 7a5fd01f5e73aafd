#!/usr/bin/env python3
"""ncu_forwards.py — split an ncu CSV of a berth run into forward passes and summarise kernel time per pass.

    ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file run.csv build/host/berth bench ...
    tools/ncu_forwards.py run.csv            # one line per forward pass (kernels, summed kernel time)
    tools/ncu_forwards.py run.csv 2 8        # breakdowns of passes 2 and 8: per kernel name, then per launch shape
    tools/ncu_forwards.py run.csv last       # breakdowns of the last forward (> 50 kernels) and of its logits head
    tools/ncu_forwards.py run.csv fullest    # the slowest decode pass (the fewest kernels among forwards of > 50
                                             # kernels: no prefill chunk; the slowest: the fullest batch) + head

A pass starts at a get_rows kernel that follows a kernel of another kind (the embedding lookup); the logits
head (get_rows of the logit rows, norm, LM head, sampling) therefore shows as a short pass of its own after each
forward. Times are ncu's serialized kernel durations: no overlap between kernels (programmatic dependent launch
off), so small kernels read a few microseconds longer than inside a CUDA graph.
"""
import collections
import csv
import re
import sys


def load(path):
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        name = re.sub(r'\(.*', '', re.sub(r'<.*', '', r['Kernel Name']).replace('void ', ''))
        us = float(r['Metric Value'].replace(',', '')) / 1000.0
        rows.append((name, r['Grid Size'], r['Block Size'], us))
    return rows


def passes(rows):
    out, cur, prev = [], [], None
    for k in rows:
        if 'get_rows' in k[0] and (prev is None or 'get_rows' not in prev):
            if cur:
                out.append(cur)
            cur = []
        cur.append(k)
        prev = k[0]
    if cur:
        out.append(cur)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fw = passes(load(sys.argv[1]))
    for i, f in enumerate(fw):
        print(f"forward {i}: {len(f)} kernels, {sum(k[3] for k in f):.1f} us")
    picks = []
    for a in sys.argv[2:]:
        if a in ('last', 'fullest'):
            big = [i for i, f in enumerate(fw) if len(f) > 50]
            if big and a == 'fullest':
                fewest = min(len(fw[i]) for i in big)
                big = [max((i for i in big if len(fw[i]) == fewest), key=lambda i: sum(k[3] for k in fw[i]))]
            if big:
                picks += [big[-1]] + ([big[-1] + 1] if big[-1] + 1 < len(fw) else [])
        else:
            picks.append(int(a))
    for i in picks:
        f = fw[i]
        shape = collections.OrderedDict()
        for k in f:
            a = shape.setdefault(k[:3], [0, 0.0])
            a[0] += 1
            a[1] += k[3]
        total = sum(v[1] for v in shape.values())
        print(f"\n== forward {i}: {len(f)} kernels, {total:.1f} us")
        byname = collections.defaultdict(lambda: [0, 0.0])
        for (n, _, _), v in shape.items():
            byname[n][0] += v[0]
            byname[n][1] += v[1]
        for n, v in sorted(byname.items(), key=lambda kv: -kv[1][1]):
            print(f"  {v[1]:9.1f} us {100 * v[1] / total:5.1f}%  n={v[0]:4d} avg={v[1] / v[0]:7.2f}  {n}")
        print("  -- by launch shape")
        for (n, g, b), v in sorted(shape.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {v[1]:9.1f} us n={v[0]:4d} avg={v[1] / v[0]:7.2f} {n} grid={g} block={b}")


if __name__ == '__main__':
    main()
