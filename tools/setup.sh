#!/usr/bin/env bash
# Installs everything ferry needs on Debian 12 (apt packages, the Python test tools in build/venv)
# and builds it into build/. Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev clang-19 python3 python3-venv python3-pip
  libcaf-dev libboost1.81-dev libboost-json1.81-dev libsimdjson-dev libcli11-dev libspdlog-dev
  libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev patchelf
  # The operations tests: headless Chromium drives the admin page, promtool (in Debian's prometheus)
  # checks /metrics, systemd-analyze verifies tools/ferry.service.
  chromium fonts-dejavu-core prometheus systemd
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  # Only promtool is wanted from the prometheus package: where systemd runs, its server is not.
  if [ -d /run/systemd/system ] && systemctl is-enabled -q prometheus 2>/dev/null; then
    $sudo systemctl disable --now prometheus || true
  fi
fi

if [ ! -x build/venv/bin/python ]; then
  python3 -m venv build/venv
fi
build/venv/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements-test.txt

cmake_args=(-G Ninja)
# The CUDA toolkit is not a Debian package here; use it where it is installed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  cmake_args+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
if [ "${CI:-}" = "true" ]; then
  cmake_args+=(-DFERRY_WERROR=ON)
fi
cmake -S . -B build "${cmake_args[@]}" ${FERRY_CMAKE_ARGS:-}
cmake --build build
