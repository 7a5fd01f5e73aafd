#!/usr/bin/env python3
"""skinny_plan.py — the skinny kernel's planner (plugins/backend-cuda/matmul_skinny.cu, sk_plan_bn / sk_choose) run
on the host, to see which tile width, split and grid it picks per product before spending device time.

    python3 bench/skinny_plan.py [--m 32] [--xh | --no-xh] [--widths 128,64,32]

Prints, for Gemma 4 E2B's decode products at M rows, each width's plan (column blocks, K split, blocks, modelled
us). A mirror of the C cost model with its constants (SK_DRAM_BPUS ...): when those change in matmul_skinny.cu,
change them here. It does not model sk_clusters_fit (the occupancy query that may shrink a split on the device), so
the grid seen in a kernel trace can have fewer splits. The model ranks tilings; the decode step decides
(bench/RESULTS.md session 18: the model's preferred wide tiles were 5.5% slower at 32 sequences).
"""
import argparse

DRAM_BPUS, L2_BPUS, LAT_US, SM_BPUS = 4.2e6, 9.0e6, 1.5, 6.0e4
SPLIT_US, PER_SPLIT_US = 0.3, 0.03
SK_BK, MAX_STAGES, GPC_SMS, MAX_CLUSTER = 64, 8, 16, 16
SMEM_TWO, SMEM_ONE = 110 * 1024, 220 * 1024

# E2B decode products: name -> (outputs N (HALVES: per half), K, halves)
E2B = {
    "q|k|v (sliding)": (2048 + 256 + 256, 1536, False),
    "q (kv-shared, sliding)": (2048, 1536, False),
    "q|k|v (full, head 512)": (4096 + 512 + 512, 1536, False),
    "o": (1536, 2048, False),
    "gate|up": (6144, 1536, True),
    "gate|up (double-wide)": (12288, 1536, True),
    "down": (1536, 6144, False),
    "down (double-wide)": (1536, 12288, False),
    "LM head": (262144, 1536, False),
}


def exists(bn, nt, xh):
    """matmul_skinny.cu's instance table (sk_info_nt): XH NT 4, 8 x BN 32, 64, 128; f32 x BN 64, 128, 256 (NT >= 4)."""
    if xh:
        return nt in (4, 8) and bn in (32, 64, 128)
    return bn in (64, 128) or (bn == 256 and nt >= 4)


def stages(bn, nt, xh):
    mp = nt * 8
    stage = bn * SK_BK * 2 + mp * SK_BK * (2 if xh else 4) + (0 if xh else SK_BK * 4)
    xb = 0 if xh else mp * SK_BK * 2
    budget = SMEM_ONE if bn == 256 else SMEM_TWO
    return min((budget - xb - 64 * 4) // stage, MAX_STAGES)


def plan(bn, m, nout, k, halves, xh, nt, n_sms=132, max_cluster=MAX_CLUSTER, groups=1):
    per_sm = 1 if bn == 256 else 2
    s = stages(bn, nt, xh)
    no = bn // 2 if halves else bn
    cb = -(-nout // no) * groups
    nkt = -(-k // SK_BK)
    slots = n_sms * per_sm
    cap = max(1, min(nkt // 2, max_cluster))
    splits = max(1, min(slots // cb, cap))
    n_gpc = max(1, n_sms // GPC_SMS)
    while splits > 1 and cb > n_gpc * (GPC_SMS * per_sm // splits):
        splits -= 1
    per = -(-nkt // splits)
    splits = -(-nkt // per)
    blocks = cb * splits
    wbytes = (2 * nout if halves else nout) * k * 2.0 * groups
    xbytes = cb * m / groups * k * (2.0 if xh else 4.0)
    resident = min(blocks, slots)
    inflight = resident * min(per, s - 1) * bn * SK_BK * 2.0
    rate = min(DRAM_BPUS, L2_BPUS * wbytes / (wbytes + xbytes), min(resident, n_sms) * SM_BPUS)
    cost = max(LAT_US + wbytes / rate, LAT_US * wbytes / inflight)
    waves = -(-blocks // slots)
    cost += (waves - 1) * LAT_US / per_sm
    if splits > 1:
        cost += SPLIT_US + PER_SPLIT_US * splits
    return cb, splits, blocks, waves, cost


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=32, help="rows of x (sequences in the decode step)")
    ap.add_argument("--xh", dest="xh", action="store_true", default=None, help="x already rounded (XH instances)")
    ap.add_argument("--no-xh", dest="xh", action="store_false")
    ap.add_argument("--widths", default="256,128,64,32", help="tile widths to plan")
    a = ap.parse_args()
    xh = a.xh if a.xh is not None else a.m > 8  # the default range: XH above skinny_max_m = 8 rows
    nt = (4 if a.m <= 32 else 8) if xh else (1 if a.m <= 8 else 2 if a.m <= 16 else 4 if a.m <= 32 else 6 if a.m <= 48 else 8)
    print(f"M = {a.m}, {'XH' if xh else 'f32 x'}, NT = {nt}")
    for name, (n, k, halves) in E2B.items():
        cells = []
        for bn in (int(w) for w in a.widths.split(",")):
            if not exists(bn, nt, xh):
                continue
            cb, sp, bl, wv, c = plan(bn, a.m, n, k, halves, xh, nt)
            cells.append(f"BN {bn}: {cb}x{sp} = {bl} blocks, {wv} wave(s), {c:.2f} us")
        print(f"{name:24s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
