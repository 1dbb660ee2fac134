#!/usr/bin/env bash
# setup.sh — install what a fresh Debian 12 machine is missing (idempotent), then configure and
# build ferry in ./build (Release). Used by the README's two commands and by CI.
#   FERRY_BUILD_DIR=build  FERRY_CUDA=AUTO|ON|OFF  FERRY_JOBS=<n>  FERRY_BUILD_TARGETS="ferry_cli ..." (default: all)
# Arguments name more packages to install with the rest (scripts/bench-cpu.sh asks for the PyTorch peers).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config
          libopenblas-dev libdnnl-dev libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
          dataset-fashion-mnist python3
          clang libclang-rt-14-dev
          libopenmpi-dev openmpi-bin
          "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ferry setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "ferry setup: all packages present"
fi

build_dir=${FERRY_BUILD_DIR:-build}
jobs=${FERRY_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA="${FERRY_CUDA:-AUTO}"
# FERRY_BUILD_TARGETS: what to build (default everything; train.sh builds only the command line it runs).
# shellcheck disable=SC2086
cmake --build "$build_dir" -j "$jobs" ${FERRY_BUILD_TARGETS:+--target $FERRY_BUILD_TARGETS}
