#!/usr/bin/env bash
# Builds bench/moe in $TESSEL_BUILD_DIR (default build/release) and runs it beside its PyTorch
# eager peer (the venv of scripts/torch-venv.sh, default /tmp/torch-venv or $TESSEL_TORCH_VENV;
# skipped with the reason where there is none). Flags are the bench's; a --torch among them
# overrides the venv.
#
#   bench/moe/run.sh                       # 2048 tokens, C 64, F 32, 64 experts, top-2
#   bench/moe/run.sh --experts 128 --reps 3
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSEL_BUILD_DIR:-$root/build/release}

torch_args=(--torch auto)
for arg in "$@"; do
  case $arg in --torch | --torch=*) torch_args=() ;; esac
done
cmake --build "$build" --target moe_bench >&2
exec "$build/bench/moe_bench" "${torch_args[@]}" "$@"
