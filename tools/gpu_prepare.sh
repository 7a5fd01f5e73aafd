#!/bin/sh
# gpu_prepare.sh — on the development machine: build the folder the lent GPU machine runs (tools/gpu_run.sh) and
# fill .devcarry/ (git-ignored) with what that machine lacks. Then call the device tool with
# carry = ["build-gpu", ".devcarry"] and the command `bash tools/gpu_run.sh tests` (or bench, or shell '...').
#
#   tools/gpu_prepare.sh            # BUILD_DIR (default build-gpu) configured --buildtype=release if absent
#   tools/gpu_prepare.sh --slim     # the same, then move the object folders (*.p) out to BUILD_DIR.objs/, and
#                                   # the test executables no GPU-suite test runs (tests.json) to
#                                   # BUILD_DIR.objs/tests-bin/: the carry limit is 64 MiB with the tracked tree
#                                   # (~30 MB) included; config files and folders in BUILD_DIR/tests stay. The
#                                   # CUDA plugin (~27 MB) is carried as plugins/berth-backend-cuda.so.xz (~10 MB;
#                                   # tools/gpu_run.sh unpacks it there), the .so itself waits in BUILD_DIR.stash/
#   tools/gpu_prepare.sh --restore  # move them back (BEFORE the next ninja run: ninja would rebuild everything)
#
# .devcarry/lib: the shared libraries the GPU image has no package for (inih, pcre2, utf8proc, subunit; jansson
# too, to be safe), copied from this machine (Debian 12: glibc 2.36 <= the GPU image's 2.39, so they load there).
# .devcarry/COMMIT: the commit the build was made from (the logs name it). BUILD_DIR/tests.json: `meson
# introspect --tests`, which tools/run_tests_json.py runs there (that machine's meson may be another version).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
objs=$build.objs
move_objs() { # FROM TO: every *.p folder under FROM/plugins and FROM/tests to the same place under TO
    for d in plugins tests; do
        [ -d "$1/$d" ] || continue
        mkdir -p "$2/$d"
        for p in "$1/$d"/*.p; do
            [ -e "$p" ] && mv "$p" "$2/$d/"
        done
    done
    return 0
}
gpu_test_bins() { # the basenames of the executables the GPU suite runs (BUILD_DIR/tests.json)
    python3 -c 'import json, os, sys
t = json.load(open(sys.argv[1]))
print(" ".join(sorted({os.path.basename(x["cmd"][0]) for x in t if any("gpu" in s for s in x["suite"])})))' "$1/tests.json"
}
move_test_bins() { # BUILD OBJS: executables in BUILD/tests that no GPU test runs, to OBJS/tests-bin
    keep=" $(gpu_test_bins "$1") "
    mkdir -p "$2/tests-bin"
    for f in "$1"/tests/*; do
        [ -f "$f" ] && [ -x "$f" ] || continue
        case "$keep" in *" $(basename "$f") "*) ;; *) mv "$f" "$2/tests-bin/" ;; esac
    done
}
stash=$build.stash
cuda_so=$build/plugins/berth-backend-cuda.so
unstash() { # the CUDA plugin back from the stash (its .xz removed: it would be stale after a rebuild)
    if [ -f "$stash/berth-backend-cuda.so" ]; then
        mv "$stash/berth-backend-cuda.so" "$cuda_so"
        rm -f "$cuda_so.xz"
    fi
    rmdir "$stash" 2>/dev/null || true
}
if [ "${1:-}" = --restore ]; then
    unstash
    if [ -d "$objs/tests-bin" ]; then
        mv "$objs"/tests-bin/* "$build/tests/" 2>/dev/null || true
        rm -rf "$objs/tests-bin"
    fi
    [ -d "$objs" ] && move_objs "$objs" "$build" && rm -rf "$objs"
    echo "gpu_prepare: object folders back in $build"
    exit 0
fi
unstash
if [ -d "$objs" ]; then # a previous --slim: back before building
    if [ -d "$objs/tests-bin" ]; then
        mv "$objs"/tests-bin/* "$build/tests/" 2>/dev/null || true
        rm -rf "$objs/tests-bin"
    fi
    move_objs "$objs" "$build" && rm -rf "$objs"
fi
export PATH="/usr/local/cuda/bin:$PATH"
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release
# This meson does not give nvcc its dependency files (plugins/backend-cuda/README.md). plugins/backend-cuda/
# meson.build rebuilds every CUDA object after a header edit by itself since bd9d550 (a header digest on the compile
# line); this rule stays for builds of plugins/ from commits before that (tools/gpu_ab_plugin.sh of an older
# branch checks out their meson.build too) and costs nothing otherwise: when a header the CUDA
# plugin includes is newer than the oldest CUDA object of this build folder, delete all its CUDA objects so
# that ninja rebuilds them (touching the sources would make every other build folder rebuild too). (A stale
# cuda_backend.cu object once kept reporting ABI 0.3 after the 0.4 bump: the GPU machine's registry rejected the
# plugin and every Gemma 4 suite failed there.)
# Every folder with CUDA objects counts: the plugin's own and the static library of matmul_skinny.cu (built for
# sm_90a too) linked into it. Missing the skinny library once left it reading a backend struct whose middle had
# grown a field: a host-side SIGFPE at 8 sequences (session 26).
oldest=
for o in "$build"/plugins/*.p/*.cu.o; do
    [ -f "$o" ] || continue
    if [ -z "$oldest" ] || [ "$o" -ot "$oldest" ]; then oldest=$o; fi
done
if [ -n "$oldest" ] && [ -n "$(find plugin-api plugins/common plugins/backend-cuda \( -name '*.h' -o -name '*.cuh' \) \
        -newer "$oldest" | head -n 1)" ]; then
    echo "gpu_prepare: a header is newer than $oldest: rebuilding $build's CUDA objects"
    rm -f "$build"/plugins/*.p/*.cu.o
fi
ninja -C "$build"
meson introspect "$build" --tests > "$build/tests.json"
mkdir -p .devcarry/lib
for l in libinih.so.1 libjansson.so.4 libpcre2-8.so.0 libsubunit.so.0 libutf8proc.so.2; do
    cp -L "/lib/x86_64-linux-gnu/$l" .devcarry/lib/
done
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+dirty"
printf '%s' "$commit" > .devcarry/COMMIT
if [ "${1:-}" = --slim ]; then
    move_objs "$build" "$objs"
    move_test_bins "$build" "$objs"
    if [ -f "$cuda_so" ]; then
        xz -9e -T0 -c "$cuda_so" > "$cuda_so.xz"
        mkdir -p "$stash"
        mv "$cuda_so" "$stash/"
    fi
    echo "gpu_prepare: object folders and non-GPU test executables moved to $objs, the CUDA plugin packed" \
        "(--restore brings them back)"
fi
du -sh "$build" .devcarry
echo "gpu_prepare: $build and .devcarry ready (commit $commit)"
