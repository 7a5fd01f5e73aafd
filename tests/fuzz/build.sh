#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (Debian clang + libclang-rt-*-dev) under ASan + UBSan, apart from the
# meson build, and optionally runs them: the tokenizer's loader and encode/decode, the safetensors header
# (st_open), the INI config (config_load), a checkpoint's config.json as the host and the Gemma 4 plugin read
# it, a sharded checkpoint's index (ckpt_open) and tokenizer_config.json's chat template with a conversation
# (chat_render) — the parsers of untrusted files.
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
"$CC" "${flags[@]}" -o "$out/fuzz_safetensors_open" "$root/tests/fuzz/fuzz_safetensors_open.c" \
  "$root/host/safetensors.c" "$root/host/errors.c" -ljansson
"$CC" "${flags[@]}" -o "$out/fuzz_config_load" "$root/tests/fuzz/fuzz_config_load.c" \
  "$root/host/config.c" "$root/host/errors.c" -linih
g4=("$root"/plugins/model-gemma4/gemma4_config.c "$root"/plugins/model-gemma4/gemma4_util.c)
"$CC" "${flags[@]}" -I"$root/plugins/model-gemma4" -o "$out/fuzz_gemma4_config" "$root/tests/fuzz/fuzz_gemma4_config.c" \
  "$root"/host/{checkpoint,json_path,safetensors,host_services,config,errors}.c "${g4[@]}" -ljansson -linih -lm
"$CC" "${flags[@]}" -o "$out/fuzz_chat_template" "$root/tests/fuzz/fuzz_chat_template.c" "$root/host/chat_template.c" \
  "$root/host/errors.c" -ljansson
"$CC" "${flags[@]}" -o "$out/fuzz_checkpoint_index" "$root/tests/fuzz/fuzz_checkpoint_index.c" \
  "$root"/host/{checkpoint,json_path,safetensors,errors}.c -ljansson
targets=(fuzz_tokenizer_load fuzz_tokenizer_encode fuzz_safetensors_open fuzz_config_load fuzz_gemma4_config
         fuzz_chat_template fuzz_checkpoint_index)
echo "built ${targets[*]/#/$out/}"
if [ "${2:-}" = run ]; then
  secs=${3:-60} logs=${4:-$out}
  mkdir -p "$logs"
  logs=$(cd "$logs" && pwd) # absolute: the fuzzers run from $out
  export BERTH_SOURCE_ROOT=$root UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  cd "$out"
  # Run every target even when one finds something; fail afterwards if any did (pipefail carries a fuzzer's exit
  # status through tail, which keeps the end of each log: the report and the run totals).
  run() { # TARGET MAX_LEN CORPUS [SEEDS]
    local t=$1 max=$2 corpus=$3
    shift 3
    mkdir -p "$corpus"
    ./"$t" -max_total_time="$secs" -max_len="$max" -timeout=20 -rss_limit_mb=4096 "$corpus" "$@" 2>&1 |
      tail -n 60 > "$logs/$t.log"
  }
  rc=0
  run fuzz_tokenizer_load 65536 corpus_load "$root/tests/fuzz/seeds_load" || rc=1
  run fuzz_tokenizer_encode 4096 corpus_encode || rc=1
  run fuzz_safetensors_open 4096 corpus_safetensors "$root/tests/fuzz/seeds_safetensors" || rc=1
  run fuzz_config_load 4096 corpus_config "$root/tests/fuzz/seeds_config" || rc=1
  run fuzz_gemma4_config 16384 corpus_gemma4_config "$root/tests/fuzz/seeds_gemma4_config" || rc=1
  run fuzz_chat_template 16384 corpus_chat "$root/tests/fuzz/seeds_chat" || rc=1
  run fuzz_checkpoint_index 4096 corpus_index "$root/tests/fuzz/seeds_index" || rc=1
  echo "ran $secs s each; logs in $logs"
  exit $rc
fi
