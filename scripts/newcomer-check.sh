#!/usr/bin/env bash
# A newcomer's walkthrough: runs the commands of README.md, docs/getting-started.md and
# docs/training.md as written, and compares what is deterministic (the losses and validation
# losses at each printed step, exact lines where a page says so) with what the pages show.
#
# Markers (an HTML comment, invisible on the rendered page, on the line before a fenced block):
#   <!-- newcomer-check: run [fast] [slow] -->  the block is shell commands: run them with bash
#       (-e, pipefail). Blocks run in the repository root, except `fast` ones, which need only
#       the tools on PATH and run in one scratch folder (in page order, so a later block sees
#       an earlier one's files). `slow` ones (the whole test suite) run only with --all.
#   <!-- newcomer-check: expect [exact] [tol=X] -->  the block is the output of the last run
#       block: every "step N/M [...] loss X", "step N/M val loss X" and "val loss X nats/byte"
#       line of it must be printed with the same value (within tol, default 0: the printed
#       digits); with `exact`, every line but "..." must be printed as is.
# Blocks without a marker (outputs shown for reading, set-up that changes the build's options)
# are counted and not run.
#
#   scripts/newcomer-check.sh              every marked block but the slow ones (minutes)
#   scripts/newcomer-check.sh --all        also the slow ones (scripts/test.sh: 25 minutes)
#   scripts/newcomer-check.sh --fast --bin build/release/bin   the fast blocks only (seconds;
#                                          the ctest NewcomerCheckFast runs this)
# Exit status: 0 every check passed, 1 a command failed or an output differs, 64 usage;
# with --fast, 0 and a SKIP line when --bin lacks a tool the blocks use.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mode=default
bin=$repo/build/release/bin
while (($#)); do
  case $1 in
    --all) mode=all ;;
    --fast) mode=fast ;;
    --bin) bin=$(cd "${2:?--bin needs a folder}" && pwd); shift ;;
    *) echo "newcomer-check: unknown argument '$1' (expected --all, --fast, --bin DIR)" >&2; exit 64 ;;
  esac
  shift
done
if ! command -v python3 >/dev/null; then
  echo "newcomer-check: SKIP: python3 not found (it reads the pages' blocks)"
  exit 0
fi
if [[ $mode == fast ]]; then
  for tool in train_gpt tessel-run tessel-plot; do
    if [[ ! -x $bin/$tool ]]; then
      echo "newcomer-check: SKIP: $bin/$tool is not built (build train_gpt tessel-run tessel-plot)"
      exit 0
    fi
  done
fi
scratch=$(mktemp -d "${TMPDIR:-/tmp}/newcomer-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export PATH="$bin:$PATH"
exec python3 - "$repo" "$mode" "$scratch" README.md docs/getting-started.md docs/training.md <<'EOF'
import re, subprocess, sys
repo, mode, scratch, pages = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
marker = re.compile(r"^<!-- newcomer-check: (run|expect)\b(.*?)-->\s*$")
loss = re.compile(r"step +(\d+)/\d+ \[[#.]*\] loss ([0-9.]+)")
val = re.compile(r"step +(\d+)/\d+ val loss ([0-9.]+)")
final = re.compile(r"val loss ([0-9.]+) nats/byte")

def figures(text):
    out = {}
    for line in text.splitlines():
        for name, rx in (("loss at step", loss), ("val loss at step", val)):
            m = rx.search(line)
            if m: out[f"{name} {m.group(1)}"] = float(m.group(2))
        m = final.search(line)
        if m: out["final val loss"] = float(m.group(1))
    return out

failures, ran, compared, unmarked, skipped = [], 0, 0, 0, 0
for page in pages:
    lines = open(f"{repo}/{page}").read().splitlines()
    i, pending, last_output, last_ran = 0, None, None, False
    while i < len(lines):
        m = marker.match(lines[i])
        if m:
            pending = (m.group(1), m.group(2).split())
            i += 1
            continue
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            block = "\n".join(lines[i + 1:j])
            lang = lines[i][3:].strip()
            where = f"{page}:{i + 1}"
            if pending is None:
                if lang in ("", "sh", "bash", "console"): unmarked += 1
            elif pending[0] == "run":
                opts = pending[1]
                wanted = ("fast" in opts) if mode == "fast" else (mode == "all" or "slow" not in opts)
                last_ran = wanted
                if not wanted:
                    skipped += 1
                else:
                    ran += 1
                    cwd = scratch if "fast" in opts else repo
                    print(f"newcomer-check: {where}: running in {'a scratch folder' if cwd == scratch else 'the repository'}:\n  " + block.replace("\n", "\n  "), flush=True)
                    p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=cwd,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    last_output = p.stdout
                    if p.returncode != 0:
                        failures.append(f"{where}: exit status {p.returncode}; last lines:\n" + "\n".join(p.stdout.splitlines()[-5:]))
                        last_output = None
            elif pending[0] == "expect" and last_ran and last_output is not None:
                opts = pending[1]
                tol = float(next((o[4:] for o in opts if o.startswith("tol=")), "0"))
                compared += 1
                if "exact" in opts:
                    got = set(last_output.splitlines())
                    for line in block.splitlines():
                        if line.strip() != "..." and line not in got:
                            failures.append(f"{where}: the page shows a line the run did not print: {line!r}")
                else:
                    want, got = figures(block), figures(last_output)
                    if not want:
                        failures.append(f"{where}: an expect block without a loss line")
                    for key, value in want.items():
                        if key not in got:
                            failures.append(f"{where}: the page shows {key} = {value}; the run printed none")
                        elif abs(got[key] - value) > tol + 1e-12:
                            failures.append(f"{where}: the page shows {key} = {value}; the run printed {got[key]}")
            pending = None
            i = j + 1
            continue
        if lines[i].strip():
            pending = None if not lines[i].startswith("<!--") else pending
        i += 1

print(f"newcomer-check: {ran} blocks run, {compared} outputs compared, {skipped} skipped "
      f"({'only fast ones' if mode == 'fast' else 'slow: --all runs them'}), {unmarked} unmarked blocks not run")
for f in failures:
    print(f"newcomer-check: FAIL: {f}")
sys.exit(1 if failures else 0)
EOF
