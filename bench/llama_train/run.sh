#!/usr/bin/env bash
# Builds bench/llama_train in $TESSEL_BUILD_DIR (default build/release) and runs it beside its
# PyTorch peers. PyTorch is the venv of scripts/torch-venv.sh (default /tmp/torch-venv, or
# $TESSEL_TORCH_VENV), made with pip on first use; where there is none and pip cannot make one
# (no network, say) the bench times tessel alone and says why. Flags are the bench's; a --torch
# among them overrides the venv.
#
#   bench/llama_train/run.sh                     # LlamaConfig::tiny(), context 256, batch 8
#   bench/llama_train/run.sh --rounds 1 --steps 1 --warmup 1 --contenders tessel_f32,eager_f32
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSEL_BUILD_DIR:-$root/build/release}

torch_args=(--torch auto)
for arg in "$@"; do
  case $arg in --torch | --torch=*) torch_args=() ;; esac
done
cmake --build "$build" --target llama_train >&2
exec "$build/bench/llama_train" "${torch_args[@]}" "$@"
