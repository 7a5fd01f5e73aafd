#!/bin/sh
# gpu_ab_plugin.sh — on the development machine: build the CUDA and Gemma 4 plugins of another commit in BUILD_DIR
# (default build-gpu) and pack them into .devcarry/ab/NAME/, for bench/ab_env.sh's `PLUGINS=.devcarry/ab/NAME`
# setting on the lent GPU machine (ab_env.sh unpacks the .xz there). Then BUILD_DIR is rebuilt from the working tree.
#
#   tools/gpu_ab_plugin.sh NAME COMMIT
#
# Why: a same-call A/B of two builds is the only comparison that holds on that machine (bench/RESULTS.md), and doing
# this by hand (stash, check out, build, copy, pack, restore, rebuild) went wrong more than once.
#
# Only the plugins/ and plugin-api/ folders come from COMMIT (host/ stays: ab_env.sh runs this tree's berth with the
# other plugins). They are checked out into the working tree for the build and put back afterwards: uncommitted
# changes there are stashed first and popped at the end; files COMMIT has there and HEAD has not are removed again.
# The script refuses to start with untracked files under those folders (they could not be told apart). Run
# tools/gpu_prepare.sh --slim after it, before the device call (this leaves BUILD_DIR built, not slim). The carry
# limit is 64 MiB in all: a packed CUDA plugin is ~6 MB.
set -eu
[ $# -eq 2 ] || { sed -n 2,16p "$0" >&2; exit 2; }
name=$1
commit=$2
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build-gpu}
case $name in */* | "" | .*) echo "gpu_ab_plugin: NAME '$name' must be a plain folder name" >&2; exit 2 ;; esac
git rev-parse --verify --quiet "$commit^{commit}" >/dev/null || { echo "gpu_ab_plugin: no commit '$commit'" >&2; exit 2; }
if [ -n "$(git ls-files --others --exclude-standard -- plugins plugin-api)" ]; then
    echo "gpu_ab_plugin: untracked files under plugins/ or plugin-api/; commit, move or remove them first" >&2
    exit 1
fi
stashed=0
if ! git diff --quiet HEAD -- plugins plugin-api; then
    git stash push --quiet -m "gpu_ab_plugin $name" -- plugins plugin-api
    stashed=1
fi
added=$(git diff --name-only --diff-filter=A HEAD "$commit" -- plugins plugin-api)
restore() { # the working tree's plugins/ and plugin-api/ as they were
    git checkout --quiet HEAD -- plugins plugin-api
    for f in $added; do rm -f "$f"; done
    if [ "$stashed" = 1 ]; then git stash pop --quiet || echo "gpu_ab_plugin: 'git stash pop' failed: your changes are in the stash" >&2; fi
}
trap restore EXIT
git checkout --quiet "$commit" -- plugins plugin-api
BUILD_DIR=$build tools/gpu_prepare.sh >/dev/null # restores a slim folder, rebuilds what changed (headers included)
out=.devcarry/ab/$name
rm -rf "$out"
mkdir -p "$out"
cp "$build/plugins/berth-backend-cuda.so" "$build/plugins/berth-model-gemma4.so" "$out/"
xz -T2 -6 -f "$out/berth-backend-cuda.so"
git rev-parse --short "$commit" >"$out/COMMIT"
trap - EXIT
restore
BUILD_DIR=$build tools/gpu_prepare.sh >/dev/null
echo "gpu_ab_plugin: $out holds $(cat "$out/COMMIT")'s CUDA and Gemma 4 plugins; $build is the working tree's again"
