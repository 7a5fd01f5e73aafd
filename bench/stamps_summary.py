#!/usr/bin/env python3
"""stamps_summary.py — medians of the CUDA backend's phase-stamp log lines (BERTH_CUDA_ATT_PROF=1 in a measurement
build: -Dattention_stamps=true and / or -Dskinny_stamps=true; docs/config.md), one line per call shape.

    python3 bench/stamps_summary.py LOG

Each logged call reads "WHAT: stamp min/med/max us: K:MIN/MED/MAX(BLOCKS) ..." (us from the call's first block
start). Per WHAT (the kernel and its shape) this prints the number of calls and, per stamp K, the median over the
calls of the median block and of the last block: "K:MED/MAX".
"""
import collections
import re
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    calls = collections.defaultdict(list)
    for line in open(sys.argv[1], errors="replace"):
        m = re.search(r"(?:cuda: |\[cuda\] )(.*?): stamp min/med/max us:(.*)", line)
        if not m:
            continue
        stamps = {int(k): (float(med), float(mx))
                  for k, _, med, mx, _ in re.findall(r" (\d+):([\d.]+)/([\d.]+)/([\d.]+)\((\d+)\)", m.group(2))}
        calls[m.group(1)].append(stamps)
    for what, lst in sorted(calls.items(), key=lambda kv: -len(kv[1])):
        ks = sorted({k for s in lst for k in s})
        cols = []
        for k in ks:
            med = statistics.median(s[k][0] for s in lst if k in s)
            mx = statistics.median(s[k][1] for s in lst if k in s)
            cols.append("%d:%.2f/%.2f" % (k, med, mx))
        print("%-75s n=%4d  %s" % (what[:75], len(lst), " ".join(cols)))


if __name__ == "__main__":
    main()
