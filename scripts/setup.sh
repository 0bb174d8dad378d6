#!/usr/bin/env bash
# Installs every system dependency tessel needs that is missing (Debian/Ubuntu, apt as root)
# and reports the CUDA toolkit it finds. Idempotent: with everything present it only checks.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git
  # house style: the format check (scripts/check-format.sh) and the thread-safety pass (clang's
  # -Wthread-safety over the annotated files, tests/base)
  clang-format clang
  # collectives and control plane
  libopenmpi-dev openmpi-bin libgloo-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # math
  libopenblas-dev libdnnl-dev
  # JSON, command lines, formatting
  nlohmann-json3-dev libcli11-dev libfmt-dev
  # the BPE tokenizers' pre-tokenization patterns (data/)
  libpcre2-dev
  # the demo's real corpus, the Debian Reference (GPL-2+; scripts/real_corpus.sh)
  debian-reference-en
  # tests; network namespaces for multi-node tests (benchmarks use their own timers)
  libgtest-dev iproute2 procps
  # a real Slurm for the slurm-labelled tests (scripts/slurm-testbed.sh starts its own
  # slurmctld and slurmd in namespaces; the packages' system services are not used)
  slurmctld slurmd slurm-client
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    sudo=()
  elif command -v sudo >/dev/null; then
    sudo=(sudo)
  else
    echo "setup: missing packages (${missing[*]}) and not root; install them with apt-get" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all ${#packages[@]} system packages present"
fi

# cudnn-frontend: the header-only C++ Graph API over cuDNN that the cuDNN attention backend
# (kernels/attention/cudnn/) is written against. It ships in PyPI's nvidia-cudnn-frontend wheel;
# its include/ is unpacked, at a pinned version, into .cache/deps/cudnn-frontend of this checkout,
# where CMake looks (TESSEL_CUDNN_FRONTEND_DIR overrides the place). Without it (or without
# network) the build still works: the cuDNN backend compiles as a stub.
cudnn_frontend_version=1.32.0
install_cudnn_frontend() {
  local root dir tmp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  dir=${TESSEL_CUDNN_FRONTEND_DIR:-$root/.cache/deps/cudnn-frontend}
  if [[ -f $dir/include/cudnn_frontend.h && $(cat "$dir/VERSION" 2>/dev/null) == "$cudnn_frontend_version" ]]; then
    echo "setup:   cudnn-frontend: $cudnn_frontend_version at $dir"
    return
  fi
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" \
       "nvidia-cudnn-frontend==$cudnn_frontend_version" >/dev/null 2>&1; then
    rm -rf "$dir" && mkdir -p "$dir"
    python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dir" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
    echo "$cudnn_frontend_version" >"$dir/VERSION"
    echo "setup:   cudnn-frontend: installed $cudnn_frontend_version at $dir"
  else
    echo "setup:   cudnn-frontend: could not download nvidia-cudnn-frontend==$cudnn_frontend_version" \
         "from PyPI; the cuDNN attention backend will be a stub" >&2
  fi
  rm -rf "$tmp"
}

# The CUDA toolkit is not installed here (it comes from NVIDIA, not Debian); report what exists.
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -n $nvcc ]]; then
  cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  echo "setup: CUDA toolkit $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $cuda_root"
  header_version() {  # header, macro prefix -> "major.minor.patch" or "not found"
    local h
    for h in "$cuda_root/include/$1" "/usr/local/include/$1" "/usr/include/$1"; do
      if [[ -f $h ]]; then
        awk -v p="$2" '$1=="#define" && $2==p"MAJOR"{a=$3} $2==p"MINOR"{b=$3}
          $2==p"PATCHLEVEL"||$2==p"PATCH"{c=$3} END{print a"."b"."c}' "$h"
        return
      fi
    done
    echo "not found"
  }
  echo "setup:   cuBLAS: $(ls "$cuda_root"/lib64/libcublas.so* >/dev/null 2>&1 && echo found || echo 'not found')"
  echo "setup:   cuDNN:  $(header_version cudnn_version.h CUDNN_)"
  echo "setup:   NCCL:   $(header_version nccl.h NCCL_)"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup:   GPUs:   $(nvidia-smi -L | wc -l)"
  else
    echo "setup:   GPUs:   none visible (GPU tests will skip)"
  fi
  install_cudnn_frontend
else
  echo "setup: no CUDA toolkit (nvcc not found); building CPU-only"
fi
