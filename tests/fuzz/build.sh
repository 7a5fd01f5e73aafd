#!/usr/bin/env bash
# Builds the tokenizer libFuzzer targets with clang (Debian clang + libclang-rt-*-dev) under ASan + UBSan, apart
# from the meson build, and optionally runs them.
#   tests/fuzz/build.sh [OUT_DIR]                     build into OUT_DIR (default build-fuzz/)
#   tests/fuzz/build.sh OUT_DIR run SECONDS [LOG_DIR]  build, then run each target SECONDS (logs in LOG_DIR)
# A finding makes the run exit non-zero; its reproducer lands in OUT_DIR/crash-*.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/build-fuzz}
mkdir -p "$out"
CC=${CC:-clang}
flags=(-g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$root/host" -I"$root/plugin-api")
libs=(-ljansson -lpcre2-8 -lutf8proc -lz -lm)
src=("$root"/host/tokenizer.c "$root"/host/tok_*.c "$root"/host/errors.c)
for t in fuzz_tokenizer_load fuzz_tokenizer_encode; do
  "$CC" "${flags[@]}" -o "$out/$t" "$root/tests/fuzz/$t.c" "${src[@]}" "${libs[@]}"
done
echo "built $out/fuzz_tokenizer_load $out/fuzz_tokenizer_encode"
if [ "${2:-}" = run ]; then
  secs=${3:-60} logs=${4:-$out}
  mkdir -p "$logs" "$out/corpus_load" "$out/corpus_encode"
  logs=$(cd "$logs" && pwd) # absolute: the fuzzers run from $out
  export BERTH_SOURCE_ROOT=$root UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  cd "$out"
  # Run both targets even when the first finds something; fail afterwards if either did (pipefail carries a
  # fuzzer's exit status through tail, which keeps the end of each log: the report and the run totals).
  rc=0
  ./fuzz_tokenizer_load -max_total_time="$secs" -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
    corpus_load "$root/tests/fuzz/seeds_load" 2>&1 | tail -n 60 > "$logs/fuzz_tokenizer_load.log" || rc=1
  ./fuzz_tokenizer_encode -max_total_time="$secs" -max_len=4096 -timeout=20 -rss_limit_mb=4096 \
    corpus_encode 2>&1 | tail -n 60 > "$logs/fuzz_tokenizer_encode.log" || rc=1
  echo "ran $secs s each; logs in $logs"
  exit $rc
fi
