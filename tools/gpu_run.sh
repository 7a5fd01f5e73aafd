#!/bin/bash
# gpu_run.sh — run on the lent GPU machine (the `device` tool), from the repository root, with a build folder made
# on the development machine and carried along (it embeds that machine's absolute paths, /work/main/...).
#
#   tools/gpu_run.sh tests [--name SUBSTR ...]    the GPU suite, from BUILD_DIR/tests.json (meson introspect --tests)
#   tools/gpu_run.sh bench [gpu_gemma4.sh args]   bench/gpu_gemma4.sh
#   tools/gpu_run.sh shell 'COMMAND'              anything else, in the same environment, e.g. an A/B of switches:
#       tools/gpu_run.sh shell 'BUILD_DIR=build-gpu bench/ab_env.sh -r 2 -c 1,8,32 default BERTH_CUDA_PDL=0'
#   or of two builds (PLUGINS=DIR: a folder with another build's CUDA plugin and the Gemma 4 plugin):
#       tools/gpu_run.sh shell 'BUILD_DIR=build-gpu bench/ab_env.sh -r 2 -c 8,32 default PLUGINS=/tmp/other'
#
# Environment: BUILD_DIR (default build-gpu), OUT (logs are copied there; the device tool collects it).
# Libraries the GPU image lacks (inih, pcre2, utf8proc, subunit, jansson) come from .devcarry/lib, copied from
# the development machine's Debian packages (tools/gpu_prepare.sh). Logs are tagged with the commit.
set -u -o pipefail
root=$(pwd)
build=${BUILD_DIR:-build-gpu}
out=${OUT:-/tmp/berth-gpu-out}
mkdir -p "$out"
# The carried build folder names /work/main/...: make that path lead here.
if [ "$(readlink -f /work/main 2>/dev/null)" != "$(readlink -f "$root")" ]; then
    mkdir -p /work && rm -rf /work/main && ln -s "$root" /work/main
fi
export LD_LIBRARY_PATH="$root/.devcarry/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# tools/gpu_prepare.sh --slim carries the CUDA plugin packed: unpack it beside its .xz (every call: the carried
# folder replaces the machine's copy each time)
for x in "$build"/plugins/*.so.xz; do
    [ -e "$x" ] && xz -dkf "$x"
done
commit=$(cat .devcarry/COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
export COMMIT="$commit"
{
    echo "# berth GPU run, commit $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
} | tee "$out/header.txt"
what=${1:-tests}
[ $# -gt 0 ] && shift
case $what in
    tests)
        # meson there may be another version than the one that configured the build: run the introspected list.
        python3 tools/run_tests_json.py "$build/tests.json" --suite gpu --log "$out/testlog.txt" "$@" 2>&1 |
            tee "$out/tests.log"
        exit $? ;;
    bench)
        BUILD_DIR=$build bash bench/gpu_gemma4.sh "$@" 2>&1 | tee "$out/bench.log" ;; # bash: the script uses bash syntax
    shell)
        sh -c "$1" 2>&1 | tee "$out/shell.log" ;;
    *) echo "gpu_run.sh: unknown mode '$what' (tests, bench, shell)" >&2; exit 2 ;;
esac
