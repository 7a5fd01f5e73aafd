#!/usr/bin/env python3
"""ktrace_summary.py — one decode step's kernels from a bench/ktrace.c trace: where the step's time goes.

    python3 bench/ktrace_summary.py TRACE.csv [--graph auto|ID] [--replay N] [--top 30] [--list A:B]

The trace holds every kernel of the run. Graph replays are told apart by the graph id CUPTI records: --graph auto
takes the graph with the most kernels per replay whose replays are most frequent (at `berth bench` with one
concurrency level, the decode graph), --replay N picks its N-th replay from the end (default 3: past warm-up,
clear of the tail). For that replay it prints:
  - the step's wall time (first start to last end) and the sum of kernel durations;
  - per kernel kind (demangled name, grid): count, total busy time, and the step time it is exposed for: a
    kernel's "exposed" time is the part of its [start, end] not covered by the kernels before it in launch order,
    i.e. how long the step waits on it. Under programmatic dependent launch a kernel starts early and waits in
    griddepcontrol.wait, so its duration includes that wait: exposed time is the better cost;
  - the largest gaps between one kernel's end and the next one's start (no kernel running);
  - between the replay and the one before it: the period (first start to first start), the gap with no graph
    kernel running, and every record that ran in between (copies, memsets, kernels outside the graph) — what
    the host puts on the stream between two decode steps;
  - with --list A:B, kernels A..B-1 of the replay in launch order: start and end (us from the replay's first
    start), duration, exposed time, name and grid — one layer's chain, to see which kernel waits on which.
Replays are separated by graph node ids repeating: a replay is one run over the graph's nodes.
"""
import argparse
import collections
import csv
import shutil
import subprocess
import sys


def demangle(names):
    """Mangled -> readable names through c++filt when it exists (else unchanged)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def short(name):
    """A kernel's name without its parameter list ('void k<2, 8>(args)' -> 'k<2, 8>')."""
    name = name[5:] if name.startswith("void ") else name
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i]
    return name


def load(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({
                "start": int(r["start_ns"]), "end": int(r["end_ns"]), "graph": int(r["graph"]),
                "node": int(r["graph_node"]), "grid": (int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])),
                "block": int(r["block_x"]) * int(r["block_y"]) * int(r["block_z"]), "cluster": int(r["cluster_x"]),
                "name": r["name"],
            })
    rows.sort(key=lambda r: r["start"])
    return rows


def replays_of(rows, graph):
    """The graph's kernels in start order, cut into replays where a node id repeats."""
    reps, cur, seen = [], [], set()
    for r in rows:
        if r["graph"] != graph:
            continue
        if r["node"] in seen:
            reps.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r["node"])
    if cur:
        reps.append(cur)
    return reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--graph", default="auto")
    ap.add_argument("--replay", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--list", default="", help="A:B, kernels A..B-1 of the replay in launch order")
    a = ap.parse_args()
    rows = load(a.trace)
    if not rows:
        sys.exit("ktrace_summary: no kernels in " + a.trace)
    graphs = collections.Counter(r["graph"] for r in rows if r["graph"] != 0)
    if not graphs:
        sys.exit("ktrace_summary: no graph-launched kernels (graphs off?)")
    if a.graph == "auto":
        best = None
        for g in graphs:
            reps = replays_of(rows, g)
            key = (len(reps) >= 4, max(len(x) for x in reps) * min(len(reps), 50))
            if best is None or key > best[0]:
                best = (key, g)
        graph = best[1]
    else:
        graph = int(a.graph)
    reps = replays_of(rows, graph)
    if len(reps) < a.replay:
        sys.exit("ktrace_summary: graph %d has %d replays" % (graph, len(reps)))
    step = reps[-a.replay]
    names = demangle(sorted({r["name"] for r in step}))
    t0, t1 = step[0]["start"], max(r["end"] for r in step)
    busy = sum(r["end"] - r["start"] for r in step)
    print("graph %d: %d replays of up to %d kernels; replay %d from the end: %d kernels, wall %.1f us, kernel time "
          "%.1f us" % (graph, len(reps), max(len(x) for x in reps), a.replay, len(step), (t1 - t0) / 1e3, busy / 1e3))
    # exposed time: the part of each kernel's interval past the furthest end of the kernels started before it
    agg = collections.defaultdict(lambda: [0, 0, 0])
    horizon = t0
    for r in step:
        exposed = max(0, r["end"] - max(r["start"], horizon))
        horizon = max(horizon, r["end"])
        key = "%s grid=%s" % (short(names[r["name"]]), "x".join(str(v) for v in r["grid"] if v > 1) or "1")
        agg[key][0] += 1
        agg[key][1] += r["end"] - r["start"]
        agg[key][2] += exposed
    total_exposed = sum(v[2] for v in agg.values())
    print("%-72s %5s %10s %10s %7s" % ("kernel", "n", "busy us", "exposed us", "share"))
    for key, (n, b, e) in sorted(agg.items(), key=lambda kv: -kv[1][2])[: a.top]:
        print("%-72s %5d %10.1f %10.1f %6.1f%%" % (key[:72], n, b / 1e3, e / 1e3, 100.0 * e / max(total_exposed, 1)))
    gaps = []
    horizon = step[0]["end"]
    for prev, r in zip(step, step[1:]):
        horizon = max(horizon, prev["end"])
        if r["start"] > horizon:
            gaps.append((r["start"] - horizon, short(names[prev["name"]]), short(names[r["name"]])))
    gaps.sort(reverse=True)
    print("idle gaps: %d, %.1f us in all; largest:" % (len(gaps), sum(g[0] for g in gaps) / 1e3))
    for g, p, n in gaps[:8]:
        print("  %7.2f us  %s -> %s" % (g / 1e3, p[:50], n[:50]))
    if len(reps) > a.replay:
        prev = reps[-a.replay - 1]
        p0, p1 = prev[0]["start"], max(r["end"] for r in prev)
        periods = [b[0]["start"] - x[0]["start"] for x, b in zip(reps[-21:-1], reps[-20:])]
        print("between replays: period %.1f us (median of the last %d: %.1f us), gap %.1f us from the previous "
              "replay's last end to this one's first start" % ((t0 - p0) / 1e3, len(periods),
                                                                sorted(periods)[len(periods) // 2] / 1e3,
                                                                (t0 - p1) / 1e3))
        others = [r for r in rows if r["graph"] != graph and r["end"] > p1 - 20000 and r["start"] < t0]
        other_names = demangle(sorted({r["name"] for r in others if not r["name"].startswith("mem")}))
        for r in others:
            nm = r["name"] if r["name"].startswith("mem") else short(other_names[r["name"]])
            print("  %9.2f %9.2f %7.2f  %s%s" % ((r["start"] - p1) / 1e3, (r["end"] - p1) / 1e3,
                                               (r["end"] - r["start"]) / 1e3, nm[:60],
                                               " (graph %d)" % r["graph"] if r["graph"] else ""))
    if a.list:
        lo, hi = (int(v) for v in a.list.split(":"))
        print("%4s %9s %9s %7s %7s  %s" % ("#", "start us", "end us", "dur", "exposed", "kernel"))
        horizon = t0
        for i, r in enumerate(step):
            exposed = max(0, r["end"] - max(r["start"], horizon))
            horizon = max(horizon, r["end"])
            if lo <= i < hi:
                grid = "x".join(str(v) for v in r["grid"] if v > 1) or "1"
                print("%4d %9.2f %9.2f %7.2f %7.2f  %s grid=%s" % (i, (r["start"] - t0) / 1e3, (r["end"] - t0) / 1e3,
                                                           (r["end"] - r["start"]) / 1e3, exposed / 1e3,
                                                           short(names[r["name"]])[:50], grid))


if __name__ == "__main__":
    main()
