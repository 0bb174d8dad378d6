#!/usr/bin/env bash
# Regenerates tests/data/fixtures (the tokenizer reference ids) with tiktoken and tokenizers from
# PyPI, installed into a virtual environment under /tmp (never needed by the build or CI: the
# fixtures are committed). Usage: scripts/data_fixtures.sh [VENV_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-/tmp/tessel-data-venv}
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c 'import tiktoken, tokenizers' 2>/dev/null ||
  "$venv/bin/pip" install -q tiktoken tokenizers
"$venv/bin/python" "$root/tests/data/make_fixtures.py" "$root/tests/data/fixtures"
echo "data_fixtures: wrote $root/tests/data/fixtures"
