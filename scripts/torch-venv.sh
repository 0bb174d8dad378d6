#!/usr/bin/env bash
# Makes (once) a Python venv with PyTorch (the CPU wheel) from PyPI for the benchmarks' PyTorch
# peers and the tests that use torch, and prints its python's path. Idempotent.
#   scripts/torch-venv.sh            # -> /tmp/torch-venv/bin/python (or $TESSEL_TORCH_VENV)
set -euo pipefail
venv=${TESSEL_TORCH_VENV:-/tmp/torch-venv}
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "torch-venv: creating $venv (PyTorch from PyPI; a few minutes)" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu >&2 ||
    "$venv/bin/pip" install -q torch >&2
fi
echo "$venv/bin/python"
