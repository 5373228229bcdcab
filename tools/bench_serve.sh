#!/usr/bin/env bash
# Starts `ferry serve` with the arguments before `--`, runs tools/bench_serve.py against it with the
# arguments after `--`, and stops it. The benchmark's last case (shutdown) sends the server SIGTERM
# with a stream running and checks that it drains and exits 0; this script, the server's parent,
# hands it the exit code. Without that case the server is stopped here.
#
#   tools/bench_serve.sh [--ferry BIN] [--log FILE] [--ready-timeout S] [SERVE ARGS...] [-- BENCH ARGS...]
#
# e.g. tools/bench_serve.sh --synthetic ../shared/configs/glm-5.3-flash-12-layers.json --type q4_k \
#        --backend cuda -- --compare-seed --json bench.json
# SERVE ARGS get --port 0 (a free port, read from the log) unless they name one. The exit status is
# the benchmark's (1 when a case failed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ferry=${FERRY_BIN:-$here/../build/ferry}
python=${PYTHON:-python3}
log=""
ready_timeout=3600
serve=()
while [[ $# -gt 0 && $1 != -- ]]; do
  case $1 in
    --ferry) ferry=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --ready-timeout) ready_timeout=$2; shift 2 ;;
    *) serve+=("$1"); shift ;;
  esac
done
[[ ${1:-} == -- ]] && shift
bench=("$@")
[[ " ${serve[*]-} " == *" --port "* ]] || serve+=(--port 0)
[[ -n $log ]] || log=$(mktemp /tmp/ferry-bench-serve-XXXXXX.log)
codefile=$(mktemp /tmp/ferry-bench-serve-code-XXXXXX)
rm -f "$codefile"  # appears when the server has exited

"$ferry" serve "${serve[@]}" >"$log" 2>&1 &
server=$!
bench_pid=""
cleanup() {
  [[ -n $bench_pid ]] && kill "$bench_pid" 2>/dev/null
  kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
}
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT  # whatever way this script ends, the server it started does not outlive it

url=""
for ((i = 0; i < 3000; i++)); do
  url=$(grep -o -m1 'listening on http://[0-9.]*:[0-9]*' "$log" | sed 's/^listening on //')
  [[ -n $url ]] && break
  if ! kill -0 "$server" 2>/dev/null; then
    wait "$server"; echo "ferry serve exited with $? before listening:" >&2; cat "$log" >&2; exit 1
  fi
  sleep 0.1
done
[[ -n $url ]] || { echo "ferry serve did not say where it listens (log: $log)" >&2; cleanup; exit 1; }
url=${url/0.0.0.0/127.0.0.1}
echo "bench_serve.sh: ferry serve (pid $server) on $url, log $log" >&2

"$python" "$here/bench_serve.py" --url "$url" --server-pid "$server" --exit-code-file "$codefile" \
  --wait-ready "$ready_timeout" "${bench[@]}" &
bench_pid=$!

# Whichever ends first: the server (its exit code goes to the benchmark) or the benchmark (then the
# server is stopped here).
while kill -0 "$server" 2>/dev/null && kill -0 "$bench_pid" 2>/dev/null; do sleep 0.05; done
if ! kill -0 "$server" 2>/dev/null; then
  wait "$server"; code=$?
  echo "$code" >"$codefile.tmp" && mv "$codefile.tmp" "$codefile"
  wait "$bench_pid"; status=$?
else
  wait "$bench_pid"; status=$?
  kill -TERM "$server" 2>/dev/null; wait "$server"; code=$?
fi
bench_pid=""
rm -f "$codefile"
echo "bench_serve.sh: ferry serve exited with $code; benchmark status $status (server log: $log)" >&2
exit "$status"
