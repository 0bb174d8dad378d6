#!/usr/bin/env bash
# Builds bench/pipeline in $TESSEL_BUILD_DIR (default build/release) and runs it beside its
# PyTorch peer (torch.distributed.pipelining; the venv of scripts/torch-venv.sh, default
# /tmp/torch-venv or $TESSEL_TORCH_VENV; skipped with the reason where there is none). Flags are
# the bench's; a --torch among them overrides the venv.
#
#   bench/pipeline/run.sh                        # pp 4, 8 micro-batches, GPipe and 1F1B
#   bench/pipeline/run.sh --steps 3 --embd 64 --seq 64
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSEL_BUILD_DIR:-$root/build/release}

torch_args=(--torch auto)
for arg in "$@"; do
  case $arg in --torch | --torch=*) torch_args=() ;; esac
done
cmake --build "$build" --target bench_pipeline >&2
exec "$build/bench/bench_pipeline" "${torch_args[@]}" "$@"
