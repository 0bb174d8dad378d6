#!/usr/bin/env bash
# Fuzzes the safetensors loader with libFuzzer (clang, ASan + UBSan) for a bounded time.
#
#   scripts/fuzz_safetensors.sh [SECONDS]     # default 60
#
# Configures a clang build in build/fuzz and builds safetensors_fuzz there, seeds the corpus with
# valid files written in the format's layout, and fails on any crash, leak or
# sanitizer report. Needs clang >= 15 with the libFuzzer runtime and libomp; installs clang-15
# and libomp-15-dev when missing (apt as root), since only fuzzing needs them.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=build/fuzz
cxx=$(command -v clang++-17 || command -v clang++-16 || command -v clang++-15 || true)
if [[ -z $cxx && $(id -u) -eq 0 ]]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    clang-15 libomp-15-dev >/dev/null
  cxx=$(command -v clang++-15 || true)
fi
if [[ -z $cxx ]]; then
  echo "fuzz_safetensors: needs clang++ 15 or newer (apt-get install clang-15 libomp-15-dev)" >&2
  exit 1
fi
cc=${cxx/clang++/clang}
san="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSEL_WITH_CUDA=OFF \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DTESSEL_BUILD_FUZZERS=ON -DTESSEL_BUILD_BENCH=OFF \
  -DTESSEL_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$out" -j2 safetensors_fuzz
mkdir -p "$out/corpus"

# Seeds: a small valid file per dtype, written by hand in the format's layout.
python3 - "$out/corpus" <<'PY'
import json, struct, sys, os
sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "BOOL": 1}
for name, size in sizes.items():
    header = {"__metadata__": {"k": "v"},
              "a": {"dtype": name, "shape": [2, 3], "data_offsets": [0, 6 * size]},
              "b": {"dtype": name, "shape": [], "data_offsets": [6 * size, 7 * size]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(sys.argv[1], f"seed_{name}"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(range(7 * size)))
PY

"$out/tests/tensor/safetensors_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -artifact_prefix="$out/" "$out/corpus"
