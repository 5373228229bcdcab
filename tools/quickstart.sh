#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: install, build, and serve the embedded default model.
# Extra arguments go to `ferry serve` (e.g. --port 9527 --host 0.0.0.0).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec build/ferry serve "$@"
