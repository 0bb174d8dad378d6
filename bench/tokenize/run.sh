#!/usr/bin/env bash
# Builds bench/tokenize in $TESSEL_BUILD_DIR (default build/release) and runs it beside
# tiktoken: tiktoken is installed from PyPI into a venv this script makes ($TESSEL_TIKTOKEN_VENV,
# default /tmp/tiktoken-venv) on first use; where pip cannot make it (no network, say) the bench
# times tessel alone and prints why. The text is the demo's real corpus (scripts/real_corpus.sh:
# the Debian Reference, from Debian's debian-reference-en) unless --text FILE is given.
#
#   bench/tokenize/run.sh                    # 2 threads for the multi-threaded rows, 5 repeats
#   bench/tokenize/run.sh --threads 4 --repeats 3
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSEL_BUILD_DIR:-$root/build/release}
venv=${TESSEL_TIKTOKEN_VENV:-/tmp/tiktoken-venv}

python=none
reason=""
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import tiktoken' 2>/dev/null; then
  python=$venv/bin/python
elif ! command -v python3 >/dev/null; then
  reason="no python3"
elif ! out=$(python3 -m venv "$venv" 2>&1 && "$venv/bin/pip" install -q tiktoken 2>&1); then
  reason="pip install tiktoken failed: $(echo "$out" | tail -1)"
else
  python=$venv/bin/python
fi
text_args=()
case " $* " in *" --text "*) ;; *)
  "$root/scripts/real_corpus.sh" /tmp/tessel-bench-corpus >&2
  cat /tmp/tessel-bench-corpus/text/doc_*.txt >/tmp/tessel-bench-corpus/all.txt
  text_args=(--text /tmp/tessel-bench-corpus/all.txt) ;;
esac
cmake --build "$build" --target bench_tokenize >&2
exec "$build/bench/bench_tokenize" --python "$python" --skip-reason "$reason" \
  --ranks "$root/tests/data/fixtures/bpe.tiktoken" \
  --tiktoken-script "$root/bench/tokenize/tiktoken_bench.py" "${text_args[@]}" "$@"
