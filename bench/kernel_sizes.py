#!/usr/bin/env python3
"""kernel_sizes.py — machine code per CUDA kernel, without a GPU: compile one .cu of a configured build folder to
an sm_90 cubin with that build's own flags (its compile_commands.json) and print each kernel's .text size, largest
first, with registers and spills from ptxas. Machine code a decode kernel carries costs at every launch, run or not
(bench/RESULTS.md, session 17), so this is the first check of a kernel change.

    bench/kernel_sizes.py BUILD_DIR FILE.cu [--grep SUBSTR ...] [--keep CUBIN]

e.g. bench/kernel_sizes.py build-gpu plugins/backend-cuda/norm.cu --grep rms_lean --grep rope
Needs nvcc (PATH or /usr/local/cuda/bin), readelf and c++filt. Sizes are bytes of sm_90 SASS.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def compile_cubin(build, src, out):
    """The build's command for src, turned into an sm_90 cubin compile; returns ptxas -v's stderr."""
    cc = json.load(open(os.path.join(build, "compile_commands.json")))
    want = os.path.realpath(src)
    for e in cc:
        f = e["file"] if os.path.isabs(e["file"]) else os.path.join(e["directory"], e["file"])
        if os.path.realpath(f) == want:
            break
    else:
        sys.exit("kernel_sizes: %s is not in %s/compile_commands.json" % (src, build))
    args = shlex.split(e["command"])
    cmd, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c"):  # replaced below
            skip = True
            continue
        if a.startswith("-gencode=") and "code=compute_" in a:  # a cubin holds one SASS target, no PTX
            continue
        cmd.append(a)
    cmd += ["-cubin", "-Xptxas", "-v", "-o", out, f]
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "") + ":/usr/local/cuda/bin"
    r = subprocess.run(cmd, cwd=e["directory"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("kernel_sizes: nvcc failed:\n" + r.stderr[-4000:])
    for line in r.stderr.splitlines():  # the compiler's warnings (ptxas -v's info lines are parsed below)
        if "warning" in line.lower():
            print(line, file=sys.stderr)
    return r.stderr


def ptxas_info(log):
    """mangled kernel name -> 'R regs, S spill' from ptxas -v output"""
    info, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for 'sm_", line)
        if m:
            cur = m.group(1)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            info.setdefault(cur, {})["spill"] = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info.setdefault(cur, {})["regs"] = int(m.group(1))
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("src")
    ap.add_argument("--grep", action="append", default=[], help="only kernels whose demangled name contains this")
    ap.add_argument("--keep", help="write the cubin here instead of a temporary file")
    a = ap.parse_args()
    out = a.keep or tempfile.NamedTemporaryFile(suffix=".cubin", delete=False).name
    try:
        info = ptxas_info(compile_cubin(a.build, a.src, out))
        sections = subprocess.run(["readelf", "-SW", out], capture_output=True, text=True, check=True).stdout
    finally:
        if not a.keep and os.path.exists(out):
            os.unlink(out)
    rows = []
    for line in sections.splitlines():
        m = re.search(r"\] \.text\.(\S+)\s+PROGBITS\s+\S+\s+\S+\s+([0-9a-f]+)", line)
        if m:
            rows.append((int(m.group(2), 16), m.group(1)))
    names = subprocess.run(["c++filt"], input="\n".join(n for _, n in rows), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    print("%8s %5s %6s  %s" % ("bytes", "regs", "spill", "kernel"))
    for (size, mangled), name in sorted(zip(rows, names), reverse=True):
        if a.grep and not any(g in name for g in a.grep):
            continue
        i = info.get(mangled, {})
        print("%8d %5s %6s  %s" % (size, i.get("regs", "?"), i.get("spill", "?"), name))


if __name__ == "__main__":
    main()
