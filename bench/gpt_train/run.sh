#!/usr/bin/env bash
# Runs bench/gpt_train with its PyTorch peers. PyTorch comes from a venv (default
# /tmp/torch-venv, or $TESSEL_TORCH_VENV), which this script makes with `pip install torch` from
# PyPI when it has no torch; where that fails (no network, say) the bench runs tessel alone and
# prints why. Builds the bench in $TESSEL_BUILD_DIR (default build/release) first. Flags are the
# bench's:
#
#   bench/gpt_train/run.sh                       # the issue's figure: 4 x 256, context 256, batch 8
#   bench/gpt_train/run.sh --rounds 7 --steps 4 --threads 2
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TESSEL_TORCH_VENV:-/tmp/torch-venv}
build=${TESSEL_BUILD_DIR:-$root/build/release}

has_torch() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch" >/dev/null 2>&1; }

if ! has_torch; then
  echo "gpt_train: making $venv with PyTorch from PyPI (pip install torch)" >&2
  { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
    "$venv/bin/pip" install --quiet torch >&2 || true
fi
torch_args=()
if has_torch; then
  torch_args=(--torch "$venv/bin/python")
else
  echo "gpt_train: PyTorch is unavailable ($venv has no torch and pip could not install it);" \
       "timing tessel alone" >&2
fi
cmake --build "$build" --target gpt_train >&2
exec "$build/bench/gpt_train" "${torch_args[@]}" "$@"
