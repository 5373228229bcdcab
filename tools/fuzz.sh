#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, libFuzzer + ASan + UBSan) and runs each for a bounded time on
# a copy of its committed seed corpus (tests/fuzz/corpus/* stays as committed):
#   gguf_reader_fuzz    the GGUF reader (model/formats)
#   http_request_fuzz   the HTTP request path: Beast's parser as the session sets it up, the router,
#                       the OpenAI body parsers; every JSON answer must parse
#   output_parser_fuzz  the streaming reasoning / tool-call parser (model/text/output_parser): any
#                       split of a text gives what the whole text gives
# Any crash, leak, over-read, undefined behaviour or broken check fails the run; the input is left as
# crash-*/leak-*/oom-*/timeout-* in the build folder.
# Usage: tools/fuzz.sh [SECONDS [TARGET...]]: SECONDS per target (default 60), every target by
# default. FERRY_FUZZ_DIR sets the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_reader_fuzz http_request_fuzz output_parser_fuzz)
out="${FERRY_FUZZ_DIR:-build/fuzz}"
mkdir -p "$out/obj"

# The targets compile their sources directly (no CMake build with sanitizers): the readers and
# parsers depend on the standard library, simdjson, Boost and CAF's headers only. _GLIBCXX_ASSERTIONS
# turns out-of-range span/vector indexing into a failure too; ferry's own assert()s stay on. Boost's
# BOOST_ASSERTs are off, as in ferry's Release build: Beast 1.81 asserts n >= 5 in
# basic_parser::parse_chunk_header where 3 bytes of a final chunk are valid and its code then asks
# for more input, as it should (boostorg/beast#2861, fixed after 1.81); with the assert compiled out,
# ASan checks that path.
# The router serves the admin page (.incbin from the source folder) and writes the request log
# (Debian's shared spdlog and fmt, configured as CMake configures them).
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
       -D_GLIBCXX_ASSERTIONS -DBOOST_DISABLE_ASSERTS -DSPDLOG_COMPILED_LIB -DSPDLOG_SHARED_LIB -DSPDLOG_FMT_EXTERNAL
       -DFMT_SHARED "-DFERRY_SOURCE_DIR=\"$PWD\"" -I.)
text=(model/text/json.cpp model/text/unicode.cpp model/text/unicode_tables.cpp)
sources_gguf_reader_fuzz=(tests/fuzz/gguf_reader_fuzz.cpp model/formats/gguf.cpp model/formats/ggml_type.cpp
                          model/formats/mapped_file.cpp)
sources_http_request_fuzz=(tests/fuzz/http_request_fuzz.cpp http/router.cpp http/openai_request.cpp
                           http/api_error.cpp http/responses.cpp http/metrics_text.cpp http/auth.cpp
                           http/safe_text.cpp http/request_registry.cpp http/request_log.cpp http/admin_page.cpp
                           actors/request_lifecycle.cpp "${text[@]}")
libs_gguf_reader_fuzz=()
libs_http_request_fuzz=(-lsimdjson -lboost_json -lcaf_core -lspdlog -lfmt -pthread)
sources_output_parser_fuzz=(tests/fuzz/output_parser_fuzz.cpp model/text/output_parser.cpp "${text[@]}")
libs_output_parser_fuzz=(-lsimdjson)
max_len_gguf_reader_fuzz=65536
max_len_http_request_fuzz=8192
max_len_output_parser_fuzz=4096
corpus_gguf_reader_fuzz=gguf
corpus_http_request_fuzz=http
corpus_output_parser_fuzz=output_parser
dict_gguf_reader_fuzz=gguf
dict_http_request_fuzz=http
dict_output_parser_fuzz=output_parser

build() {
  local -n sources="sources_$1"
  local -n libs="libs_$1"
  local objects=() i running=0
  # One object per source, compiled in parallel: a failing compile fails the run (set -e, wait).
  for i in "${!sources[@]}"; do
    objects+=("$out/obj/$1.$(basename "${sources[$i]}" .cpp).o")
    clang++ "${flags[@]}" -c "${sources[$i]}" -o "${objects[$i]}" &
    running=$((running + 1))
    if [ "$running" -ge "$(nproc)" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
  for pid in $(jobs -p); do wait "$pid"; done
  clang++ -fsanitize=fuzzer,address,undefined "${objects[@]}" ${libs[@]+"${libs[@]}"} -o "$out/$1"
}

for target in "${targets[@]}"; do
  build "$target"
done

for target in "${targets[@]}"; do
  name_of="corpus_$target" max_len_of="max_len_$target" dict_of="dict_$target"
  name=${!name_of} max_len=${!max_len_of} dict=${!dict_of}
  corpus="$out/corpus_$name"
  rm -rf "$corpus"
  cp -r "tests/fuzz/corpus/$name" "$corpus"
  log="$out/$target.log"
  status=0
  "$out/$target" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -timeout=10 \
    -dict="tests/fuzz/$dict.dict" -artifact_prefix="$out/" -print_final_stats=1 "$corpus" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$log"
    echo "fuzz: $target failed (exit $status); the input is in $out/ (crash-*, leak-*, oom-*, timeout-*)" >&2
    exit "$status"
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  echo "fuzz: $target ran $runs inputs in ${seconds}s without a failure ($(ls "$corpus" | wc -l) corpus files)"
done
