#!/usr/bin/env python3
"""sass_loops.py — the hot loops of the CUDA plugin's tensor-core kernels, from their sm_90 machine code.

    python3 bench/sass_loops.py BUILD/plugins/berth-backend-cuda.so [--match sk_kernel] [--sass FILE]

Runs `cuobjdump -sass` on the plugin (on the lent GPU machine: the development machine's toolkit has no cuobjdump;
or give --sass with a saved dump) and prints, per kernel whose name matches, its code size and each loop that
contains an MMA (HMMA): its length in instructions, how many are MMAs, shared-memory matrix loads (LDSM) and
async copies (LDGSTS), and the instructions that should never be in such a loop (S2R / S2UR reads of special
registers, BSSY / BSYNC convergence barriers).

Why (bench/RESULTS.md session 19): an edit far from matmul_skinny.cu's k loop — new epilogue code behind an
off-by-default switch — made ptxas rematerialise the loop's load addresses (SR_TID.X and SR_CgaCtaId re-read per
chunk, a branch around every cp.async): the loop went from 121 to 258 instructions per tile (as this script counts
them) and the c=32 decode step lost 7% with the new code never executed. Run this on a build before timing any
change to these kernels.
"""
import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^\s*Function : (\S+)")
ARCH = re.compile(r"^\s*code for (sm_\w+)")
INSN = re.compile(r"^\s*/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")
FLAGS = ("S2R", "S2UR", "BSSY", "BSYNC")


def parse(text):
    """{function name [arch]: [(address, instruction text)]} in code order (one entry per image: a plugin with
    sm_90 and sm_90a cubins holds two copies of a kernel at different addresses)."""
    funcs, cur, arch = {}, None, ""
    for line in text.splitlines():
        m = ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = FUNC.match(line)
        if m:
            cur = funcs.setdefault(f"{m.group(1)} [{arch}]" if arch else m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(insn):
    words = insn.split()
    if words and words[0].startswith("@"):  # predicate guard
        words = words[1:]
    return words[0] if words else ""


def mma_loops(code, outer=False):
    """Backward branches whose body holds an MMA: (start address, end address, body) — only the innermost ones
    (no other such loop inside) unless outer."""
    loops = []
    for i, (addr, insn) in enumerate(code):
        m = BRANCH.search(insn)
        if not m or not m.group(1):
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [x for a, x in code[: i + 1] if a >= target]
        if any(opcode(x).startswith(("HMMA", "HGMMA")) for x in body):
            loops.append((target, addr, body))
    if not outer:
        loops = [l for l in loops
                 if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    return loops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plugin", nargs="?", help="the CUDA plugin (.so) to disassemble with cuobjdump")
    ap.add_argument("--sass", help="a saved `cuobjdump -sass` output instead")
    ap.add_argument("--match", default="sk_kernel", help="substring of the mangled kernel names (default sk_kernel)")
    ap.add_argument("--outer", action="store_true", help="also the loops that contain other MMA loops")
    a = ap.parse_args()
    if a.sass:
        text = open(a.sass).read()
    elif a.plugin:
        try:
            text = subprocess.run(["cuobjdump", "-sass", a.plugin], check=True, capture_output=True,
                                  text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"sass_loops.py: cuobjdump -sass {a.plugin} failed: {e}")
    else:
        ap.error("give the plugin or --sass FILE")
    funcs = {n: c for n, c in parse(text).items() if a.match in n and c}
    if not funcs:
        sys.exit(f"sass_loops.py: no kernel matching '{a.match}'")
    for name in sorted(funcs):
        code = funcs[name]
        size = code[-1][0] + 16
        print(f"{name}  {size / 1024:.1f} KB")
        for start, end, body in mma_loops(code, a.outer):
            ops = [opcode(x) for x in body]
            count = lambda p: sum(1 for o in ops if o.startswith(p))
            flags = " ".join(f"{f} {count(f)}" for f in FLAGS if count(f))
            hop = f", HGMMA {count('HGMMA')}, UTMALDG {count('UTMALDG')}" if count("HGMMA") else ""
            print(f"  loop 0x{start:x}-0x{end:x}: {len(body)} instructions, HMMA {count('HMMA')}, "
                  f"LDSM {count('LDSM')}, LDGSTS {count('LDGSTS')}{hop}" + (f"  !! {flags}" if flags else ""))


if __name__ == "__main__":
    main()
