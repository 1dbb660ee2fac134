#!/usr/bin/env bash
# train.sh — the README's first command: install what is missing, build, and run `ferry train`
# (the fmnist CNN on Fashion-MNIST, on the best device). Extra arguments go to `ferry train`.
set -euo pipefail
cd "$(dirname "$0")/.."
FERRY_BUILD_TARGETS=${FERRY_BUILD_TARGETS:-ferry_cli} bash scripts/setup.sh  # the tests are test.sh's to build
# Keep what the run learns (the tour's `ferry eval --checkpoint fmnist.safetensors` reads it), unless told where.
args=("$@")
if [[ " $* " != *" --checkpoint"* && " $* " != *" --help"* && " $* " != *" -h "* ]]; then
  args+=(--checkpoint fmnist.safetensors)
  echo "train.sh: saving the model to fmnist.safetensors (pass --checkpoint FILE to choose)"
fi
exec "${FERRY_BUILD_DIR:-build}/tools/ferry/ferry" train "${args[@]}"
