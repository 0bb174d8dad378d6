#!/usr/bin/env bash
# Fails when a C++/CUDA source differs from what clang-format makes of it with the repository's
# .clang-format. The tree is kept formatted (one formatting commit), so by default every tracked
# source is checked; --changed REF checks only the files changed since REF (for a pre-commit
# hook or a quick look).
#   scripts/check-format.sh                 all tracked sources
#   scripts/check-format.sh --changed main  those changed since main (committed or not)
#   scripts/check-format.sh --fix [...]     rewrite the files instead of failing
# clang-format must be major version 14 (Debian bookworm's, installed by scripts/setup.sh):
# other versions lay some constructs out differently, so with another one the check is skipped
# with the reason printed.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
changed=""
while (($#)); do
  case $1 in
    --fix) fix=1 ;;
    --changed) changed=${2:?--changed needs a git revision}; shift ;;
    *) echo "check-format: unknown argument '$1' (expected --changed REF or --fix)" >&2; exit 64 ;;
  esac
  shift
done

if ! command -v clang-format >/dev/null; then
  echo "check-format: SKIP: clang-format not found (scripts/setup.sh installs it)"
  exit 0
fi
version=$(clang-format --version | sed -E 's/.*version ([0-9]+).*/\1/')
if [[ $version != 14 ]]; then
  echo "check-format: SKIP: clang-format $version; the tree is formatted with version 14"
  exit 0
fi

patterns=('*.cc' '*.h' '*.cu' '*.cuh')
if [[ -n $changed ]]; then
  mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$changed" -- "${patterns[@]}")
else
  mapfile -t files < <(git ls-files -- "${patterns[@]}")
fi
((${#files[@]})) || { echo "check-format: no sources to check"; exit 0; }

if ((fix)); then
  printf '%s\0' "${files[@]}" | xargs -0 clang-format -i
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted with .clang-format:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check-format: run scripts/check-format.sh --fix (or clang-format -i FILE) and commit" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
