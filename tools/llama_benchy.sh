#!/usr/bin/env bash
# Runs llama-benchy (PyPI `llama-benchy`, unmodified) against a `ferry serve` that this script starts
# with the arguments before `--`; llama-benchy gets the arguments after `--`, after these:
#   --base-url (the server) --model zai-org/GLM-5.3-Flash --served-model-name (ferry's model id)
#   --tokenizer $TOKENIZER --book-url (a local text served on loopback) --skip-coherence --exact-tg
# The server must tokenize as llama-benchy does: the embedded model's tokenizer is the default
# TOKENIZER (tests/fixtures/tokenizer); with --synthetic, give ferry serve `--tokenizer` the same one.
# The book is the repository's own text (sources and docs, ~1 MB: enough for depth 32768 + pp 2048).
#
#   tools/llama_benchy.sh [--ferry BIN] [--benchy CMD] [SERVE ARGS...] [-- LLAMA-BENCHY ARGS...]
#
# e.g. tools/llama_benchy.sh -- --pp 2048 --tg 128 --depth 0 1024
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
ferry=${FERRY_BIN:-$repo/build/ferry}
benchy=${LLAMA_BENCHY:-llama-benchy}
python=${PYTHON:-python3}
tokenizer=${TOKENIZER:-$repo/tests/fixtures/tokenizer}
serve=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --ferry) ferry=$2; shift 2 ;;
    --benchy) benchy=$2; shift 2 ;;
    *) serve+=("$1"); shift ;;
  esac
done
[[ ${1:-} == -- ]] && shift
[[ " ${serve[*]-} " == *" --port "* ]] || serve+=(--port 0)

work=$(mktemp -d /tmp/ferry-llama-benchy-XXXXXX)
find "$repo" -path "$repo/build*" -prune -o -path "$repo/.git" -prune -o \
  \( -name '*.md' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.py' \) -type f -print |
  sort | head -400 | xargs cat >"$work/book.txt"
"$ferry" serve "${serve[@]}" >"$work/serve.log" 2>&1 &
server=$!
"$python" -m http.server 0 --bind 127.0.0.1 --directory "$work" >"$work/http.log" 2>&1 &
books=$!
cleanup() {
  kill "$books" 2>/dev/null
  kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
}
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT  # whatever way this script ends, the server it started does not outlive it

url="" book_port=""
while [[ -z $url || -z $book_port ]]; do
  [[ -n $url ]] || url=$(grep -o -m1 'listening on http://[0-9.]*:[0-9]*' "$work/serve.log" | sed 's/^listening on //')
  [[ -n $book_port ]] || book_port=$(grep -o -m1 'port [0-9]*' "$work/http.log" | sed 's/port //')
  kill -0 "$server" 2>/dev/null || { echo "ferry serve exited:" >&2; cat "$work/serve.log" >&2; cleanup; exit 1; }
  sleep 0.1
done
url=${url/0.0.0.0/127.0.0.1}
# Ready when /health says ok (a synthetic or real model loads for a while).
until "$python" -c "import sys,urllib.request; sys.exit(urllib.request.urlopen('$url/health').status != 200)" 2>/dev/null; do
  kill -0 "$server" 2>/dev/null || { echo "ferry serve exited:" >&2; cat "$work/serve.log" >&2; cleanup; exit 1; }
  sleep 0.5
done
model_id=$("$python" -c "import json,urllib.request; print(json.load(urllib.request.urlopen('$url/v1/models'))['data'][0]['id'])")
echo "llama_benchy.sh: ferry serve (pid $server) on $url serving '$model_id'; book $work/book.txt ($(wc -c <"$work/book.txt") bytes)" >&2

$benchy --base-url "$url/v1" --model zai-org/GLM-5.3-Flash --served-model-name "$model_id" \
  --tokenizer "$tokenizer" --book-url "http://127.0.0.1:$book_port/book.txt" --skip-coherence --exact-tg "$@"
status=$?
cleanup
echo "llama_benchy.sh: llama-benchy status $status (server log: $work/serve.log)" >&2
exit "$status"
