#!/usr/bin/env python3
"""Run meson's tests from `meson introspect --tests` output without meson (the GPU machine's meson cannot read a
build folder made by another meson version).

    meson introspect BUILD --tests > BUILD/tests.json      (on the development machine)
    python3 tools/run_tests_json.py BUILD/tests.json [--suite gpu] [--name SUBSTR] [--log FILE]

Each test runs with its command, working directory, environment and timeout; exit 77 counts as skipped (meson's
rule). Prints one line per test and a summary; exits 1 if any test failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tests_json")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--name", action="append", default=[])
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    tests = json.load(open(a.tests_json))
    log = open(a.log, "w") if a.log else None
    counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0}
    for t in tests:
        suites = [s.split(":")[-1] for s in t.get("suite", [])]
        if a.suite and not any(s in suites for s in a.suite):
            continue
        if a.name and not any(n in t["name"] for n in a.name):
            continue
        env = dict(os.environ)
        for k, v in (t.get("env") or {}).items():
            # meson's own LD_LIBRARY_PATH for the build's libraries goes first; the caller's stays behind it.
            env[k] = v + ":" + os.environ[k] if k == "LD_LIBRARY_PATH" and os.environ.get(k) else v
        t0 = time.time()
        try:
            p = subprocess.run(t["cmd"], cwd=t.get("workdir") or None, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=t.get("timeout") or 300)
            rc, out = p.returncode, p.stdout.decode(errors="replace")
            status = "OK" if rc == 0 else "SKIP" if rc == 77 else "FAIL"
        except subprocess.TimeoutExpired as e:
            rc, out, status = -1, (e.stdout or b"").decode(errors="replace"), "TIMEOUT"
        counts[status] += 1
        line = "%-8s %-40s %6.1fs rc=%d" % (status, t["name"], time.time() - t0, rc)
        print(line, flush=True)
        if log:
            log.write("=" * 100 + "\n" + line + "\n" + out + "\n")
            log.flush()
        if status in ("FAIL", "TIMEOUT"):
            print(out[-6000:], flush=True)
    print("summary: %d ok, %d failed, %d skipped, %d timed out" % (counts["OK"], counts["FAIL"], counts["SKIP"],
                                                                   counts["TIMEOUT"]))
    return 1 if counts["FAIL"] or counts["TIMEOUT"] else 0


if __name__ == "__main__":
    sys.exit(main())
