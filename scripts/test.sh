#!/usr/bin/env bash
# Sets everything up, builds tessel and runs the whole test suite under ctest.
#   scripts/test.sh               all tests
#   scripts/test.sh -L launcher   extra arguments go to ctest (one area, -R NAME, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# House style first: a seconds-long check that fails before a long build does.
scripts/check-format.sh
preset=${TESSEL_PRESET:-release}
cmake --preset "$preset"
cmake --build --preset "$preset"
# Every test carries its own timeout; --timeout is the ceiling for any that does not.
ctest --preset "$preset" --timeout 600 "$@"
