#!/usr/bin/env python3
"""ktrace_layers.py — the decode attention's place in each layer, from a kernel trace (bench/ktrace.c's CSV).

    python3 bench/ktrace_layers.py TRACE.csv[.gz] [GRAPH]

Takes one replay (the third from the end) of GRAPH (default: the graph with the most kernel launches) and prints,
per tensor-core decode attention launch: the kernel before it (kv_append, or the q-norm + RoPE in KV-sharing
layers) and when it ends, the attention's start and end, how long after that kernel the attention ends (its
exposed time) and when its merge kernel starts relative to that kernel's end. The merge kernel is launched when
the attention's last block has started (the attention triggers at its start), so "merge start" near 0 says the
attention's last blocks became resident only when the kernel before them left (bench/RESULTS.md session 21) — under
the tracer: inside an untraced graph the attention's own stamps (BERTH_CUDA_ATT_PROF=graph) showed every block
resident early (session 22), so read this as the traced run's timeline only.
Times in us from the replay's first kernel start; a summary of the medians follows.
"""
import collections
import csv
import gzip
import statistics
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.DictReader(f))
    by_graph = collections.defaultdict(list)
    for r in rows:
        by_graph[r["graph"]].append(r)
    if len(sys.argv) == 3:
        graph = sys.argv[2]
    else:
        graph = max(by_graph, key=lambda g: len(by_graph[g]) if g not in ("", "0") else -1)
    launches = sorted(by_graph[graph], key=lambda r: int(r["start_ns"]))
    per_replay = len({r["graph_node"] for r in launches})
    if per_replay == 0 or len(launches) < per_replay:
        sys.exit("ktrace_layers: graph %s has no complete replay" % graph)
    n_rep = len(launches) // per_replay
    k = max(0, n_rep - 3)
    rep = launches[k * per_replay:(k + 1) * per_replay]
    t0 = int(rep[0]["start_ns"])

    def us(r, key):
        return (int(r[key]) - t0) / 1000.0

    print("graph %s: %d launches a replay, %d replays; replay %d: %.1f us" % (
        graph, per_replay, n_rep, k + 1, us(rep[-1], "end_ns")))
    print("%3s %-22s %9s | %9s %9s %9s | %9s" % ("#", "before", "its end", "att start", "att end", "exposed",
                                                "merge at"))
    exposed, merge_at = collections.defaultdict(list), []
    layer = 0
    for i, r in enumerate(rep):
        if "attn_decode_mma_kernel" not in r["name"] or i == 0:
            continue
        before = rep[i - 1]
        merge = rep[i + 1] if i + 1 < len(rep) and "adm_merge_kernel" in rep[i + 1]["name"] else None
        kind = "kv_append" if "kv_append" in before["name"] else "rms_rope" if "rope" in before["name"] else \
            before["name"][:22]
        dp = "d512" if "ILi512E" in r["name"] else "d256" if "ILi256E" in r["name"] else "d?"
        e = us(r, "end_ns") - us(before, "end_ns")
        m = us(merge, "start_ns") - us(before, "end_ns") if merge else float("nan")
        exposed[dp].append(e)
        if merge:
            merge_at.append(m)
        print("%3d %-22s %9.2f | %9.2f %9.2f %9.2f | %+9.2f  %s" % (
            layer, kind, us(before, "end_ns"), us(r, "start_ns"), us(r, "end_ns"), e, m, dp))
        layer += 1
    for dp, v in sorted(exposed.items()):
        print("median exposed %s: %.2f us over %d launches" % (dp, statistics.median(v), len(v)))
    if merge_at:
        print("median merge start after the kernel before the attention: %+.2f us" % statistics.median(merge_at))


if __name__ == "__main__":
    main()
