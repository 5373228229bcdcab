#!/usr/bin/env bash
# The whole test suite: set up and build, then every CPU test (GoogleTest through ctest, the Python
# tests with real clients and the reference packages). GPU tests (ctest label `cuda`) run on a GPU
# machine with tools/gpu_bundle.sh. The Volta build (CUDA 12.9 for sm_70, compiled by clang) is
# compiled too, so that both builds keep compiling from the same sources; its tests need a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
tools/build_volta.sh ferry ferry_gpu_tests
ctest --test-dir build -LE cuda --output-on-failure -j "$(nproc)"
FERRY_BIN="$PWD/build/ferry" build/venv/bin/python -m pytest tests/python -q
tools/fuzz.sh 60  # seconds per target
