#!/usr/bin/env bash
# Bundles built programs with the shared libraries they need that a bare GPU host may lack, so
# a build made here runs on a machine that has the CUDA driver and toolkit but none of the
# Debian -dev packages (oneDNN, OpenBLAS, gRPC, ...).
#
#   scripts/gpu-bundle.sh OUT.tar.gz BUILD_DIR FILE...
#
# The archive holds the given files (paths relative to BUILD_DIR), every libtessel_*.so of the
# build, and lib/ with each dependency outside glibc and the CUDA toolkit (those come from the
# target). On the target:
#   mkdir -p B && tar -xzf OUT.tar.gz -C B && LD_LIBRARY_PATH=B/lib:B/tessel B/<file>
set -euo pipefail
out=$1; build=$2; shift 2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/tessel"
find "$build" -name 'libtessel_*.so*' -exec cp -P {} "$stage/tessel/" \;
for f in "$@"; do
  mkdir -p "$stage/$(dirname "$f")"
  cp "$build/$f" "$stage/$f"
done
# Libraries the target provides itself: glibc, the compiler runtime and CUDA's own.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink|libcupti|libtessel_)'
for f in "$@" "$stage"/tessel/*.so*; do
  [[ -f $f || -f $build/$f ]] || continue
  path=$f; [[ -f $path ]] || path=$build/$f
  ldd "$path" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' | while read -r name lib; do
    [[ $name =~ $skip ]] && continue
    [[ -e $stage/lib/$name ]] || cp -L "$lib" "$stage/lib/$name"
  done
done
tar -czf "$out" -C "$stage" .
echo "gpu-bundle: $(du -h "$out" | cut -f1) -> $out ($(ls "$stage/lib" | wc -l) libraries)"
