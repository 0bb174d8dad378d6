#!/usr/bin/env bash
# Makes the PyTorch flight-recorder fixtures of tests/flight_recorder/pytorch/fixtures: creates a
# virtual environment with torch from PyPI (CPU is enough: the jobs run over Gloo), runs the hung
# jobs of make_fixtures.py, and, for the record, runs PyTorch's own analyzer (torchfrtrace) on
# every fixture. CI does not run this (it has no torch); the tests read the committed fixtures.
#
#   scripts/pytorch_fr_fixtures.sh [VENV_DIR]      (default: build/torch-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/torch-venv}
out=$root/tests/flight_recorder/pytorch/fixtures
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch
fi
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
rm -rf "$out"
# The timed-out fixtures are written in the recorder's format first (no torch needed); the real
# jobs below then replace the timeout_* scenarios make_fixtures.py runs (review the diff).
python3 "$root/tests/flight_recorder/pytorch/write_timeout_fixtures.py" "$out"
"$venv/bin/python" "$root/tests/flight_recorder/pytorch/make_fixtures.py" "$out"
for dir in "$out"/*/; do
  echo "== torchfrtrace $(basename "$dir")"
  "$venv/bin/torchfrtrace" "$dir/pickle" -p rank_ --allow-incomplete-ranks 2>&1 | tail -n 3 || true
done
