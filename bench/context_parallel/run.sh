#!/usr/bin/env bash
# Builds bench/context_parallel in $TESSEL_BUILD_DIR (default build/release) and runs it beside
# PyTorch at cp = 1 (the venv of scripts/torch-venv.sh, default /tmp/torch-venv or
# $TESSEL_TORCH_VENV; skipped with the reason where there is none). Flags are the bench's; a
# --torch among them overrides the venv.
#
#   bench/context_parallel/run.sh                         # attention S 4096, GPT S 2048
#   bench/context_parallel/run.sh --attn-seq 8192 --cp 1,2
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSEL_BUILD_DIR:-$root/build/release}

torch_args=(--torch auto)
for arg in "$@"; do
  case $arg in --torch | --torch=*) torch_args=() ;; esac
done
cmake --build "$build" --target cp_bench >&2
exec "$build/bench/cp_bench" "${torch_args[@]}" "$@"
