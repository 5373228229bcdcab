#!/usr/bin/env bash
# Builds the GGUF reader fuzzer (clang, libFuzzer + ASan + UBSan) and runs it for a bounded time on
# a copy of the committed seed corpus (tests/fuzz/corpus/gguf stays as committed). Any crash, leak,
# over-read or undefined behaviour fails the run; the input is left as crash-*/leak-*/oom-* in the
# build folder. Usage: tools/fuzz.sh [SECONDS] (default 60). FERRY_FUZZ_DIR sets the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
out="${FERRY_FUZZ_DIR:-build/fuzz}"
mkdir -p "$out"

# The reader depends on the standard library only, so the fuzzer compiles its sources directly.
# _GLIBCXX_ASSERTIONS turns out-of-range span/vector indexing into a failure too.
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -D_GLIBCXX_ASSERTIONS -I. \
  tests/fuzz/gguf_reader_fuzz.cpp model/formats/gguf.cpp model/formats/ggml_type.cpp model/formats/mapped_file.cpp \
  -o "$out/gguf_reader_fuzz"

corpus="$out/corpus_gguf"
rm -rf "$corpus"
cp -r tests/fuzz/corpus/gguf "$corpus"
log="$out/gguf_reader_fuzz.log"
status=0
"$out/gguf_reader_fuzz" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -dict=tests/fuzz/gguf.dict -artifact_prefix="$out/" -print_final_stats=1 "$corpus" >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 60 "$log"
  echo "fuzz: gguf_reader_fuzz failed (exit $status); the input is in $out/ (crash-*, leak-*, oom-*, timeout-*)" >&2
  exit "$status"
fi
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
echo "fuzz: gguf_reader_fuzz ran $runs inputs in ${seconds}s without a failure ($(ls "$corpus" | wc -l) corpus files)"
