#!/usr/bin/env bash
# ThreadSafetyTest: clang's lock analysis (-Wthread-safety) as a syntax-only pass, no clang build.
#
#   thread_safety_check.sh clean <clang++> <spec>...   every file named by a spec compiles clean
#   thread_safety_check.sh planted <clang++> <spec>    the planted file fails on each line marked
#                                                      "// violation", and on no other error
#
# A spec (written by tests/base/CMakeLists.txt) holds "build <build dir>", "source <file>", then
# "include <dir>" and "define <name[=value]>" lines (the file's library's compile settings) and
# "implicit <dir>" lines (the compiler's own include directories, never passed: -isystem
# /usr/include would hide libstdc++'s wrappers). Exits 77 (ctest's skip code for it) when clang++
# is not installed.
set -u

mode=$1
clang=$2
shift 2
if [[ -z "$clang" || "$clang" == *NOTFOUND ]] || ! command -v "$clang" >/dev/null; then
  echo "SKIP: clang++ is not installed; the thread-safety check needs it"
  exit 77
fi

flags=(-std=c++20 -fsyntax-only -Wthread-safety -Wthread-safety-beta -Werror=thread-safety
       -Werror=thread-safety-beta)
# clang before 15 knows _Float16 (tensor/dtype.h) on x86 only with AVX512-FP16; a syntax-only
# pass generates no code, so the flag changes nothing else.
[[ "$(uname -m)" == x86_64 ]] && flags+=(-mavx512fp16)

# Prints the source a spec names.
source_of() { sed -n 's/^source //p' "$1"; }

# Runs clang over one spec, diagnostics to stdout; returns clang's status.
check() {
  local build="" source="" args=() implicit=" " kind value
  while read -r kind value; do
    case $kind in
      build) build=$value ;;
      source) source=$value ;;
      implicit) implicit+="$value " ;;
      # Our own headers (under the build tree's include roots) are -I, so their warnings count;
      # everyone else's are system headers.
      include)
        if [[ "$implicit" == *" $value "* ]]; then
          continue
        elif [[ "$value" == "$build"/* ]]; then
          args+=(-I "$value")
        else
          args+=(-isystem "$value")
        fi
        ;;
      define) args+=("-D$value") ;;
    esac
  done <"$1"
  "$clang" "${flags[@]}" "${args[@]}" "$source" 2>&1
}

status=0
case $mode in
  clean)
    for spec in "$@"; do
      start=$SECONDS
      if out=$(check "$spec"); then
        echo "ok   $(source_of "$spec") ($((SECONDS - start)) s)"
      else
        echo "FAIL $(source_of "$spec")"
        echo "$out"
        status=1
      fi
    done
    ;;
  planted)
    source=$(source_of "$1")
    if out=$(check "$1"); then
      echo "FAIL $source compiled although it touches guarded data without the lock:"
      echo "the check is not checking"
      exit 1
    fi
    for line in $(grep -n '// violation' "$source" | cut -d: -f1); do
      if ! grep -q "$(basename "$source"):$line:.*-Wthread-safety" <<<"$out"; then
        echo "FAIL no thread-safety error on the planted violation at $source:$line"
        status=1
      fi
    done
    # A broken snippet (a missing include, a typo) fails too, for the wrong reason.
    others=$(grep ': error:' <<<"$out" | grep -v 'Wthread-safety')
    if [[ -n "$others" ]]; then
      echo "FAIL $source has errors besides the planted ones:"
      echo "$others"
      status=1
    fi
    [[ $status == 0 ]] && echo "ok   each planted violation in $source is an error"
    ;;
  *)
    echo "unknown mode '$mode' (expected clean or planted)"
    exit 2
    ;;
esac
exit $status
