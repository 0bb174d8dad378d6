#!/usr/bin/env bash
# Sets everything up, builds tessel and runs the most complete job that exists today.
#
# Today that is `tessel-info`: the build's configuration and the environment knobs. The training
# example (tensor core issue) and the launcher (tessel-run issue) will replace it with a GPT
# trained by several workers under tessel-run.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
echo
echo "== tessel-info =="
build/release/base/tessel-info
