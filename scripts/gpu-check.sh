#!/usr/bin/env bash
# The GPU check: everything CUDA in tessel run on a GPU host, in batches of at most 8 minutes
# each (a GPU is lent for about 15 minutes in all, 10 minutes a command), the batch that
# matters most first. Built and bundled here; nothing is built on the GPU host.
#
#   batch 1  library check (ldd of every program; cuDNN and NCCL found in the CUDA toolkit or in
#            the NVIDIA wheels of the host's PyTorch), the GPU tests, the attention tests
#            (flash_cuda, math, cuDNN, dispatch, memory), the device half of backend conformance
#   batch 2  train_gpt on the GPU, the parallel stack on CUDA (threads backend, DTensor, FSDP,
#            TP, NCCL at world size 1), the GPT / attention / FSDP benches in --quick form
#   batch 3  the full-size benches: GPT-2 124M beside PyTorch eager and torch.compile, attention
#            beside PyTorch's SDPA backends
#   batch 4  compute-sanitizer memcheck and racecheck; train_gpt over NCCL on two GPUs
#
# On a build machine (here), once per commit:
#   scripts/gpu-check.sh --pack .gpu/tessel-gpu.tar.gz [--build build/release]
# On the GPU host, in a checkout of the same commit with .gpu/ beside it, one command a batch:
#   scripts/gpu-check.sh --bundle .gpu/tessel-gpu.tar.gz --batch 1
#   scripts/gpu-check.sh --bundle .gpu/tessel-gpu.tar.gz --batch 2
# Anywhere: --dry-run lists each batch's steps and time limits and checks the bundle (or the
# build tree) for every program, library and data file the batches use; it needs no GPU.
#
# Options: --batch N (1-4, or all), --build DIR (a build tree: default build/cuda-only),
# --bundle DIR|FILE.tar.gz, --pack OUT.tar.gz (builds the programs in --build, then bundles them
# with scripts/gpu-bundle.sh: at most 64 MiB), --dry-run, --python PY (the peer benches'
# python; default python3 where it imports torch with CUDA).
# Each step has a time limit, clipped to what is left of its batch's 480 s; a failed step does
# not stop the batch; the exit status is the number of failed steps. compute-sanitizer needs a
# host that lets it profile the device (it refuses devices under gVisor: "Device not supported").
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/cuda-only"
bundle=""
pack=""
batch=all
dry_run=0
python=""
readonly batch_limit=480   # seconds: 8 minutes a batch
readonly bundle_limit=$((64 * 1024 * 1024))
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --pack) pack=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --python) python=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $batch =~ ^(1|2|3|4|all)$ ]] || { echo "gpu-check: --batch $batch is not 1, 2, 3, 4 or all" >&2; exit 2; }

attention_tests=(attention_cuda_plan_test attention_cuda_dispatch_test attention_cuda_flash_test
                 attention_cuda_cudnn_test attention_cuda_sdpa_test attention_cuda_memory_test)
gpu_tests=(cuda_smoke_test cuda_backend_test cuda_device_guard_test cuda_gpt_test)
parallel_tests=(collectives/threads_cuda_test parallel/dtensor_cuda_test parallel/fsdp_cuda_test
                parallel/tp_cuda_test collectives/nccl_backend_test)
programs=("${gpu_tests[@]/#/tests/gpu/}" tests/tensor/backend_conformance_test
          "${attention_tests[@]/#/tests/kernels/}" "${parallel_tests[@]/#/tests/}"
          examples/train_gpt bench/gpt_cuda_bench bench/attention_cuda_bench
          bench/fsdp_cuda_bench flight_recorder/tessel-trace)
# Files of the checkout the batches read.
data_files=(examples/data/corpus.txt bench/gpt_cuda/gpt_cuda_torch.py
            bench/attention_cuda/sdpa_torch_peer.py bench/fsdp_cuda/fsdp_cuda_torch.py)

# ---- The plan: batch, step id, time limit (s), title ------------------------------------------
plan=(
  "1 libs 30 library check: ldd of every program, cuDNN and NCCL located"
  "1 gpu-tests 150 GPU tests (smoke, tensor backend, device guard, GPT)"
  "1 attention 210 attention tests (flash_cuda, math, cudnn, dispatch, memory)"
  "1 conformance 80 backend conformance (every kernel vs the CPU)"
  "2 train 60 train_gpt --device cuda (60 steps)"
  "2 parallel 150 parallel stack on CUDA (threads backend, DTensor, FSDP, TP, NCCL)"
  "2 bench-quick 60 bench --quick: 2-layer GPT, bf16, beside PyTorch"
  "2 attention-bench-quick 90 bench --quick: attention at 1k and 4k, MHA and GQA, beside PyTorch SDPA"
  "2 fsdp-bench-quick 90 bench --quick: FSDP step beside PyTorch FSDP2, with its trace"
  "2 fsdp-trace 20 tessel-trace export of the FSDP run (Perfetto)"
  "3 bench 240 bench: GPT-2 124M, bf16 autocast, beside PyTorch eager and torch.compile"
  "3 attention-bench 230 bench: attention (flash_cuda, cudnn) beside PyTorch SDPA"
  "4 memcheck 200 compute-sanitizer memcheck (backend, GPT f32, flash_cuda, conformance)"
  "4 racecheck 200 compute-sanitizer racecheck (the same)"
  "4 multi-gpu 80 train_gpt on 2 GPUs over NCCL (FSDP, then FSDP x TP)"
)

in_batch() { [[ $batch == all || $batch == "$1" ]]; }

# ---- --pack: build here, bundle ----------------------------------------------------------------
if [[ -n $pack ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    (cd "$repo" && cmake --preset cuda-only) || exit 1
  fi
  targets=()
  for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
  cmake --build "$build" --target "${targets[@]}" || { echo "gpu-check: the build failed"; exit 1; }
  mkdir -p "$(dirname "$pack")"
  "$repo/scripts/gpu-bundle.sh" "$pack" "$build" "${programs[@]}" || exit 1
  size=$(stat -c %s "$pack")
  if (( size > bundle_limit )); then
    echo "gpu-check: the bundle is $((size / 1048576)) MiB, over the 64 MiB a GPU host can be sent"
    exit 1
  fi
  exit 0
fi

# ---- Where the programs are: a bundle (folder or archive) or a build tree ---------------------
root=$build
if [[ -n $bundle ]]; then
  if [[ -f $bundle ]]; then
    archive=$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")
    root=/tmp/tessel-gpu-bundle
    if (( ! dry_run )); then
      stamp=$(stat -c '%s %Y' "$archive")
      if [[ ! -f $root/.stamp || $(cat "$root/.stamp") != "$stamp" ]]; then
        rm -rf "$root" && mkdir -p "$root" && tar -xzf "$archive" -C "$root" || exit 1
        echo "$stamp" >"$root/.stamp"
      fi
    fi
  else
    root=$(cd "$bundle" && pwd) || exit 2
  fi
fi

# ---- --dry-run: the plan and the bundle's completeness ------------------------------------------
if (( dry_run )); then
  problems=0
  for b in 1 2 3 4; do
    in_batch "$b" || continue
    total=0
    echo "batch $b:"
    for row in "${plan[@]}"; do
      read -r rb id limit title <<<"$row"
      [[ $rb == "$b" ]] || continue
      printf '  %-22s %4d s  %s\n' "$id" "$limit" "$title"
      total=$((total + limit))
    done
    if (( total > batch_limit )); then
      echo "  total $total s: OVER the batch limit of $batch_limit s"
      problems=$((problems + 1))
    else
      echo "  total $total s (limit $batch_limit s)"
    fi
  done
  # What the batches need, from the bundle's listing or the build tree.
  if [[ -n $bundle && -f $bundle ]]; then
    listing=$(tar -tzf "$bundle" | sed 's|^\./||') || { echo "gpu-check: cannot read $bundle"; exit 1; }
    has() { grep -qxF "$1" <<<"$listing"; }
    has_tessel_libs() { grep -q '^tessel/libtessel_' <<<"$listing"; }
    size=$(stat -c %s "$bundle")
    echo "bundle $bundle: $((size / 1048576)) MiB (limit 64 MiB)"
    (( size > bundle_limit )) && { echo "  OVER the size limit"; problems=$((problems + 1)); }
  else
    has() { [[ -x $root/$1 ]]; }
    has_tessel_libs() { compgen -G "$root/*/libtessel_*.so*" >/dev/null || compgen -G "$root/tessel/libtessel_*.so*" >/dev/null; }
    echo "programs from $root"
  fi
  for p in "${programs[@]}"; do
    has "$p" || { echo "  missing: $p"; problems=$((problems + 1)); }
  done
  has_tessel_libs || { echo "  missing: the libtessel_*.so libraries"; problems=$((problems + 1)); }
  for f in "${data_files[@]}"; do
    [[ -f $repo/$f ]] || { echo "  missing in the checkout: $f"; problems=$((problems + 1)); }
  done
  echo "${#programs[@]} programs, ${#data_files[@]} data files checked: $problems problem(s)"
  exit $((problems > 0))
fi

if [[ -n $bundle ]]; then
  cuda_root=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  export LD_LIBRARY_PATH="$root/lib:$root/tessel:$cuda_root/lib64:$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [[ ! -x $root/examples/train_gpt ]]; then
  echo "gpu-check: no programs in $root: build them (cmake --preset cuda-only && cmake --build" \
       "--preset cuda-only) or pass --bundle" >&2
  exit 1
fi

# The peer's python, and the NVIDIA wheels of its PyTorch (cuDNN, NCCL, cuBLAS where the
# toolkit lacks them).
if [[ -z $python ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python=python3
fi
wheel_dirs=$("${python:-python3}" - 2>/dev/null <<'PY'
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
dirs = set()
for base in nvidia.__path__:
    for top, _, files in os.walk(base):
        if any(f.startswith("lib") and ".so" in f for f in files):
            dirs.add(top)
print(":".join(sorted(dirs)))
PY
)
# Only where the toolkit does not have them: each library the programs miss is looked up there.
missing_libs() {
  for p in "${programs[@]}"; do ldd "$root/$p" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u
}
if [[ -n $wheel_dirs && -n $(missing_libs) ]]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$wheel_dirs"
fi

failed=()
batch_start=$SECONDS
# step LIMIT NAME COMMAND...: runs it with its limit, clipped to what is left of the batch.
step() {
  local limit=$1 name=$2
  shift 2
  local left=$((batch_limit - (SECONDS - batch_start)))
  echo
  echo "== $name =="
  if (( left < 10 )); then
    echo "-- $name: NOT RUN (the batch's $batch_limit s are spent)"
    failed+=("$name (not run)")
    return
  fi
  (( limit > left )) && limit=$left
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@"
  local status=$?
  if [[ $status -eq 0 ]]; then
    echo "-- $name: ok ($((SECONDS - start)) s)"
  else
    echo "-- $name: FAILED (status $status$([[ $status -eq 124 ]] && echo ", past ${limit} s"), $((SECONDS - start)) s)"
    failed+=("$name")
  fi
}
limit_of() { local row; for row in "${plan[@]}"; do read -r _ id l _ <<<"$row"; [[ $id == "$1" ]] && echo "$l"; done; }
title_of() { local row; for row in "${plan[@]}"; do read -r _ id _ t <<<"$row"; [[ $id == "$1" ]] && echo "$t"; done; }
run() { local id=$1; shift; step "$(limit_of "$id")" "$(title_of "$id")" "$@"; }

library_check() {  # PROGRAM...
  local status=0 p
  for p in "$@"; do
    if [[ ! -x $root/$p ]]; then echo "missing program: $p"; status=1; continue; fi
    if ldd "$root/$p" | grep -q 'not found'; then
      echo "$p: $(ldd "$root/$p" | awk '/not found/ {print $1}' | tr '\n' ' ')not found"
      status=1
    fi
  done
  echo "resolved (train_gpt and the kernels library):"
  ldd "$root/examples/train_gpt" $(ls "$root"/tessel/libtessel_kernels.so* "$root"/kernels/libtessel_kernels.so* \
      "$root"/tessel/libtessel_collectives.so* "$root"/collectives/libtessel_collectives.so* 2>/dev/null) |
    awk '/libcudnn|libnccl|libcudart|libcublas/ {print "  " $1, "=>", $3}' | sort -u
  [[ -n $wheel_dirs ]] && echo "PyTorch's NVIDIA wheels searched where the toolkit lacked a library"
  return $status
}
export -f library_check
export root wheel_dirs

echo "== host =="
date -u
git -C "$repo" log -1 --format='tessel %h %s' 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
nvcc --version 2>/dev/null | tail -1 || true
# Without a GPU every GPU test skips and each step still "passes": say so, and count it.
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU visible (nvidia-smi -L failed): the GPU tests below will skip, so they"
  echo "           check nothing on a GPU; this counts as a failed step"
  failed+=("GPU present")
fi
peer_for() {  # the --torch arguments of a bench, given its peer script
  if [[ -n $python ]]; then echo "--torch $python --torch-script $repo/$1"; else echo "--torch none"; fi
}
[[ -z $python ]] && echo "gpu-check: no python with torch and CUDA: the benches run tessel alone"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
trace=/tmp/gpu-check-fsdp-trace
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

run_batch_1() {
  run libs bash -c 'library_check "$@"' library_check "${programs[@]}"
  run gpu-tests bash -c "set -e; for t in ${gpu_tests[*]}; do
    echo \"-- \$t\"; '$root'/tests/gpu/\$t --gtest_brief=1; done"
  run attention bash -c "set -e; for t in ${attention_tests[*]}; do
    echo \"-- \$t\"; '$root'/tests/kernels/\$t --gtest_brief=1; done"
  run conformance "$root/tests/tensor/backend_conformance_test" --gtest_brief=1 \
      --gtest_filter='BackendConformanceDevicesTest.*'
}

run_batch_2() {
  run train "$root/examples/train_gpt" --device cuda --steps 60 --log-every 20 --sample 50 \
      --data "$repo/examples/data/corpus.txt" --checkpoint /tmp/train_gpt_cuda.safetensors
  run parallel bash -c "set -e; for t in ${parallel_tests[*]}; do
    echo \"-- \$t\"; '$root'/tests/\$t --gtest_brief=1; done"
  # shellcheck disable=SC2046
  run bench-quick "$root/bench/gpt_cuda_bench" --dtype bf16 --layers 2 --steps 10 \
      $(peer_for bench/gpt_cuda/gpt_cuda_torch.py)
  run attention-bench-quick "$root/bench/attention_cuda_bench" --seq 1024,4096 --dim 128 \
      --groups 1,4 $(peer_for bench/attention_cuda/sdpa_torch_peer.py)
  rm -rf "$trace"
  run fsdp-bench-quick "$root/bench/fsdp_cuda_bench" --layers 2 --steps 10 --trace-dir "$trace" \
      $(peer_for bench/fsdp_cuda/fsdp_cuda_torch.py)
  run fsdp-trace "$root/flight_recorder/tessel-trace" export "$trace" \
      --perfetto /tmp/gpu-check-fsdp-trace.json
}

run_batch_3() {
  run bench "$root/bench/gpt_cuda_bench" --dtype bf16 $(peer_for bench/gpt_cuda/gpt_cuda_torch.py)
  run attention-bench "$root/bench/attention_cuda_bench" --groups 1 \
      $(peer_for bench/attention_cuda/sdpa_torch_peer.py)
}

sanitize() {  # API errors are the tests' business; memcheck and racecheck look at the device
  local tool=$1 status=0
  local s=("$cs" --tool "$tool" --report-api-errors no --error-exitcode 99)
  "${s[@]}" "$root/tests/gpu/cuda_backend_test" --gtest_brief=1 || status=1
  "${s[@]}" "$root/tests/gpu/cuda_gpt_test" --gtest_brief=1 --gtest_filter='*InF32:*PlainAttention*' || status=1
  "${s[@]}" "$root/tests/kernels/attention_cuda_flash_test" --gtest_brief=1 \
    --gtest_filter='*EveryGpuBackend*/bf16_B3_Hq2_Hkv2_Sq7_Sk13_D32_CausalTopLeft:*EveryGpuBackend*/f16_B1_Hq3_Hkv3_Sq77_Sk77_D80_Documents' || status=1
  "${s[@]}" "$root/tests/tensor/backend_conformance_test" --gtest_brief=1 \
    --gtest_filter='BackendConformanceDevicesTest.EveryDeviceBackendBriefly' || status=1
  return $status
}
export -f sanitize
export cs root

# Two GPUs: one process per GPU started by hand through a shared FileStore (the cuda-only build
# has no gRPC, so no tessel-run).
two_gpus() {
  local layout status=0
  for layout in "--dp-shard 2" "--dp-shard 1 --tp 2"; do
    local store; store=$(mktemp -d); local pids=()
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TESSEL_STORE_DIR=$store \
        "$root/examples/train_gpt" --device cuda $layout --steps 40 --log-every 20 --sample 0 \
        --data "$repo/examples/data/corpus.txt" --checkpoint /tmp/train_gpt_nccl.safetensors &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
  done
  return $status
}
export -f two_gpus
export repo

run_batch_4() {
  run memcheck bash -c "sanitize memcheck"
  run racecheck bash -c "sanitize racecheck"
  if [[ ${gpus:-0} -ge 2 ]]; then
    run multi-gpu bash -c two_gpus
  else
    echo; echo "== multi-GPU train_gpt: skipped, this host has ${gpus:-0} GPU(s) =="
  fi
}

for b in 1 2 3 4; do
  in_batch "$b" || continue
  echo; echo "==== batch $b (at most $batch_limit s) ===="
  batch_start=$SECONDS
  "run_batch_$b"
  echo "==== batch $b: $((SECONDS - batch_start)) s ===="
done

echo
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "gpu-check: every step passed"
else
  echo "gpu-check: ${#failed[@]} step(s) failed: ${failed[*]}"
fi
exit ${#failed[@]}
