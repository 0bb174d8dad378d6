#!/usr/bin/env bash
# Makes the tiny Hugging Face model fixtures under tests/nn/hf/ (tests/nn/hf/make_fixtures.py):
# creates a venv with torch and transformers from PyPI (not part of the repo; CI needs neither,
# the fixtures are committed), then builds and saves each model with transformers.
#
#   scripts/hf_fixtures.sh            # venv in $TESSEL_HF_VENV, default /tmp/hf-venv
#
# The same venv lets tests/nn/hf_format_test.cc check that transformers loads tessel's export.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TESSEL_HF_VENV:-/tmp/hf-venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  "$venv/bin/pip" install --progress-bar off torch transformers safetensors
fi
out="$root/tests/nn/hf"
"$venv/bin/python" "$out/make_fixtures.py" "$out"
echo "fixtures in $out; run the torch-backed test with TESSEL_TEST_TORCH_PYTHON=$venv/bin/python"
