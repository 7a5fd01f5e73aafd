#!/bin/sh
# cpu_gemma4.sh — the CPU Gemma 4 benchmark end to end: make the pinned bench checkpoint (if absent), build the
# bench and the plugins it loads, run it with configs/cpu.ini and one thread per available core, print the table.
#
#   bench/cpu_gemma4.sh [bench_gemma4 options...]      e.g. --repeat 5 --gen-len 256
#
# Environment: BUILD_DIR (default build; configured here if it does not exist), BENCH_CKPT (default
# /tmp/berth-bench-gemma4), THREADS (default: nproc). configs/cpu.ini names ../build/plugins; with another
# BUILD_DIR a copy of it pointing at BUILD_DIR/plugins is written to a temporary file and used instead.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
ckpt=${BENCH_CKPT:-/tmp/berth-bench-gemma4}
threads=${THREADS:-$(nproc)}

if [ ! -f "$ckpt/config.json" ] || [ ! -f "$ckpt/model.safetensors" ]; then
    echo "cpu_gemma4: generating the bench checkpoint into $ckpt" >&2
    /usr/bin/python3 bench/gen_bench_checkpoint.py --out "$ckpt" >&2
fi

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" >&2
fi
ninja -C "$build" bench/bench_gemma4 plugins/berth-backend-cpu.so plugins/berth-model-gemma4.so >&2

config=configs/cpu.ini
tmp=
if [ "$build" != build ]; then
    case $build in
        /*) plugdir=$build/plugins ;;
        *) plugdir=$root/$build/plugins ;;
    esac
    tmp=$(mktemp /tmp/berth-bench-cpu.XXXXXX.ini)
    trap 'rm -f "$tmp"' EXIT
    sed "s#^dir = ../build/plugins\$#dir = $plugdir#" configs/cpu.ini >"$tmp"
    if ! grep -q "^dir = $plugdir\$" "$tmp"; then
        echo "cpu_gemma4: configs/cpu.ini has no 'dir = ../build/plugins' line to point at $plugdir" >&2
        exit 1
    fi
    config=$tmp
fi

model=$(lscpu | sed -n 's/^Model name: *//p')
echo "cpu_gemma4: $model, $(nproc) cores available, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$build/bench/bench_gemma4" --config "$config" --model "$ckpt" --threads "$threads" "$@"
