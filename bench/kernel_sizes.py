#!/usr/bin/env python3
"""kernel_sizes.py — machine code per CUDA kernel, without a GPU: compile one .cu of a configured build folder to
an sm_90 cubin with that build's own flags (its compile_commands.json) and print each kernel's .text size, largest
first, with registers and spills from ptxas. Machine code a decode kernel carries costs at every launch, run or not
(bench/RESULTS.md, session 17), so this is the first check of a kernel change.

    bench/kernel_sizes.py BUILD_DIR FILE.cu [--grep SUBSTR ...] [--keep CUBIN]
    bench/kernel_sizes.py BUILD_DIR FILE.cu --lines MANGLED_SUBSTR [--top N]

e.g. bench/kernel_sizes.py build-gpu plugins/backend-cuda/norm.cu --grep rms_lean --grep rope
Needs nvcc (PATH or /usr/local/cuda/bin), readelf and c++filt. Sizes are bytes of sm_90 SASS.
--lines: where one kernel's code comes from, without a disassembler (none on the development machine): the PTX
instructions of the first entry whose mangled name contains the substring, counted per source line (.loc of a
-lineinfo compile). PTX is not SASS, but the lines that dominate one dominate the other.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def compile_cubin(build, src, out, ptx=False):
    """The build's command for src, turned into an sm_90 cubin compile (or a -lineinfo PTX one); returns the
    compiler's stderr (ptxas -v's lines for a cubin)."""
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
    cmd += (["-ptx", "-lineinfo"] if ptx else ["-cubin", "-Xptxas", "-v"]) + ["-o", out, f]
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


def ptx_lines(ptx, want, top):
    """PTX instructions per source line in the body of the first entry whose name contains want"""
    text = open(ptx).read().splitlines()
    files = {}
    for line in text:
        m = re.match(r'\s*\.file\s+(\d+)\s+"([^"]+)"', line)
        if m:
            files[m.group(1)] = os.path.basename(m.group(2))
    count, cur, inside, depth, name = {}, None, False, 0, None
    for line in text:
        s = line.strip()
        if not inside:
            if ".entry" in s and want in s:
                inside, name = True, s.split()[-1].rstrip("(")
            continue
        depth += s.count("{") - s.count("}")
        m = re.match(r"\.loc\s+(\d+)\s+(\d+)", s)
        if m:
            cur = "%s:%s" % (files.get(m.group(1), m.group(1)), m.group(2))
        elif s.endswith(";") and not s.startswith((".", "//", "$")):
            count[cur] = count.get(cur, 0) + 1
        if depth < 0 or (s == "}" and depth == 0 and count):
            break
    if name is None:
        sys.exit("kernel_sizes: no entry matching %s" % want)
    total = sum(count.values())
    print("%s: %d PTX instructions" % (name, total))
    for where, n in sorted(count.items(), key=lambda x: -x[1])[:top]:
        print("%6d %5.1f%%  %s" % (n, 100.0 * n / total, where))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("src")
    ap.add_argument("--grep", action="append", default=[], help="only kernels whose demangled name contains this")
    ap.add_argument("--keep", help="write the cubin here instead of a temporary file")
    ap.add_argument("--lines", help="PTX instructions per source line of the kernel whose mangled name has this")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if a.lines:
        out = tempfile.NamedTemporaryFile(suffix=".ptx", delete=False).name
        try:
            compile_cubin(a.build, a.src, out, ptx=True)
            ptx_lines(out, a.lines, a.top)
        finally:
            os.unlink(out)
        return
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
