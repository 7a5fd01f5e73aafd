#!/usr/bin/env python3
"""stamps_summary.py — medians of the CUDA backend's phase-stamp log lines (BERTH_CUDA_ATT_PROF=1 in a measurement
build: -Dattention_stamps=true and / or -Dskinny_stamps=true; docs/config.md), one line per call shape.

    python3 bench/stamps_summary.py LOG

Each logged call reads "WHAT: stamp min/med/max us: K:MIN/MED/MAX(BLOCKS) ..." (us from the call's first block
start). Per WHAT (the kernel and its shape) this prints the number of calls and, per stamp K, the median over the
calls of the median block and of the last block: "K:MED/MAX".

BERTH_CUDA_ATT_PROF=graph logs, when a stream goes, one line per stamped launch recorded into a graph: "graph G #I
WHAT: stamp ..." with the last replay's stamps in us from the earliest stamp of graph G. Those are printed apart,
per graph in capture order, as a timeline: each launch's first block start (stamp 0 min), the median block's and
the last block's time at each stamp, and the gap from the previous launch's last stamp to this one's last stamp.
"""
import collections
import re
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    calls = collections.defaultdict(list)
    graphs = collections.defaultdict(list)
    for line in open(sys.argv[1], errors="replace"):
        m = re.search(r"(?:cuda: |\[cuda\] )(.*?): stamp min/med/max us:(.*)", line)
        if not m:
            continue
        found = re.findall(r" (\d+):([\d.]+)/([\d.]+)/([\d.]+)\((\d+)\)", m.group(2))
        g = re.match(r"graph (\d+) #(\d+) (.*)", m.group(1))
        if g:
            graphs[int(g.group(1))].append((int(g.group(2)), g.group(3),
                                            {int(k): (float(lo), float(med), float(mx)) for k, lo, med, mx, _ in found}))
            continue
        stamps = {int(k): (float(med), float(mx)) for k, _, med, mx, _ in found}
        calls[m.group(1)].append(stamps)
    for gid in sorted(graphs):
        launches = sorted(graphs[gid])
        print("graph %d: %d stamped launches (us from its earliest stamp; K:median/last block)" % (gid, len(launches)))
        prev_end = None
        for i, what, st in launches:
            ks = sorted(st)
            end = max(v[2] for v in st.values())
            gap = "" if prev_end is None else " (+%.2f)" % (end - prev_end)
            print("  #%-4d %-60s start %8.2f  %s  end %8.2f%s" % (
                i, what[:60], st[ks[0]][0], " ".join("%d:%.2f/%.2f" % (k, st[k][1], st[k][2]) for k in ks), end, gap))
            prev_end = end
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
