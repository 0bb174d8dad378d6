#!/usr/bin/env bash
# Everything the CUDA backend and the CUDA attention kernels need checked on a GPU host, in one
# command, reported on stdout: the GPU tests, the device path of the backend-conformance test,
# compute-sanitizer memcheck and racecheck on them, train_gpt on the GPU, the GPT-2 124M bench
# beside PyTorch (eager and torch.compile) and the attention bench beside PyTorch's SDPA (the
# peers are skipped without a python that has torch with CUDA); the parallel stack on CUDA
# (threads-backend collectives, DTensor, FSDP and TP parity with ranks as threads on one GPU,
# NCCL at world size 1), the FSDP bench beside PyTorch FSDP2 with its flight-recorder trace,
# and, on a host with two or more GPUs, train_gpt under FSDP and TP over NCCL.
#
#   scripts/gpu-check.sh                     # uses build/cuda-only (configures and builds it first
#                                            # when missing: cmake --preset cuda-only)
#   scripts/gpu-check.sh --build DIR         # an existing CUDA build tree
#   scripts/gpu-check.sh --pack OUT.tar.gz   # (on a build machine) build cuda-only and bundle the
#                                            # programs below with their libraries (gpu-bundle.sh)
#   scripts/gpu-check.sh --bundle DIR        # (on the GPU host) a bundle unpacked into DIR
#
# Options: --only LIST (some of tests,attention,conformance,memcheck,racecheck,train,bench,
# attention-bench,parallel,fsdp-bench,multi-gpu; default all: where one command may run 10
# minutes at most, run `--only tests,conformance,train`, `--only attention`, `--only memcheck`,
# `--only racecheck`, `--only bench`, `--only attention-bench`, `--only parallel` and `--only
# fsdp-bench,multi-gpu` one after another), --quick (a 2-layer GPT bench instead of GPT-2 124M,
# and the attention bench at two lengths),
# --python PY (the peer's python; default: python3 if it imports torch with CUDA).
# Each step has a time limit and the run goes on after a failure; the exit status is the number
# of failed steps. compute-sanitizer needs a host that lets it profile the device (it refuses
# devices under gVisor: "Device not supported").
#
# A GPU host without the Debian packages (oneDNN, OpenBLAS, fmt, ...) cannot build; bundle the
# build made here (31 MB at the commit that added the attention tests) and carry it with the
# checkout:
#   scripts/gpu-check.sh --pack .gpu/tessel-gpu.tar.gz                   # here
#   mkdir -p /tmp/b && tar -xzf .gpu/tessel-gpu.tar.gz -C /tmp/b && scripts/gpu-check.sh --bundle /tmp/b
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/cuda-only"
bundle=""
pack=""
quick=0
only="tests,attention,conformance,memcheck,racecheck,train,bench,attention-bench,parallel,fsdp-bench,multi-gpu"
python=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --bundle) bundle=$(cd "$2" && pwd); shift 2 ;;
    --pack) pack=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --only) only=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

attention_tests=(attention_cuda_plan_test attention_cuda_dispatch_test attention_cuda_flash_test
                 attention_cuda_cudnn_test attention_cuda_sdpa_test attention_cuda_memory_test)
parallel_tests=(collectives/threads_cuda_test parallel/dtensor_cuda_test parallel/fsdp_cuda_test
                parallel/tp_cuda_test)
programs=(tests/gpu/cuda_smoke_test tests/gpu/cuda_backend_test tests/gpu/cuda_gpt_test
          tests/tensor/backend_conformance_test "${attention_tests[@]/#/tests/kernels/}"
          "${parallel_tests[@]/#/tests/}" tests/collectives/nccl_backend_test
          examples/train_gpt bench/gpt_cuda_bench bench/attention_cuda_bench
          bench/fsdp_cuda_bench flight_recorder/tessel-trace)

build_tree() {
  if [[ ! -f $build/CMakeCache.txt ]]; then
    (cd "$repo" && cmake --preset cuda-only) || return 1
  fi
  (cd "$repo" && cmake --build "$build" --target tessel_tensor tessel_kernels tessel_nn \
     train_gpt gpt_cuda_bench attention_cuda_bench cuda_smoke_test cuda_backend_test \
     cuda_gpt_test backend_conformance_test "${attention_tests[@]}" \
     "${parallel_tests[@]#*/}" nccl_backend_test fsdp_cuda_bench tessel-trace)
}

if [[ -n $pack ]]; then
  build_tree || exit 1
  exec "$repo/scripts/gpu-bundle.sh" "$pack" "$build" "${programs[@]}"
fi

if [[ -n $bundle ]]; then
  root=$bundle
  cuda_root=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  export LD_LIBRARY_PATH="$bundle/lib:$bundle/tessel:$cuda_root/lib64:$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  build_tree || { echo "gpu-check: the build failed"; exit 1; }
  root=$build
fi

want() { [[ ,$only, == *,$1,* ]]; }
failed=()
# step NAME LIMIT_SECONDS COMMAND...: runs it with a time limit and reports how it went.
step() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name =="
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local status=$?
  if [[ $status -eq 0 ]]; then
    echo "-- $name: ok ($((SECONDS - start)) s)"
  else
    echo "-- $name: FAILED (status $status$([[ $status -eq 124 ]] && echo ", past ${limit} s"), $((SECONDS - start)) s)"
    failed+=("$name")
  fi
}

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

want tests && step "GPU tests" 540 bash -c "
  set -e
  for t in tests/gpu/cuda_smoke_test tests/gpu/cuda_backend_test tests/gpu/cuda_gpt_test; do
    echo \"-- \$t\"; '$root'/\$t --gtest_brief=1
  done"
# flash_cuda, the math backend on the GPU and cuDNN against the f32 reference; the dispatcher's
# choice (cuDNN on sm_90, flash_cuda otherwise); the GPT's attention; 16k-token memory.
want attention && step "attention tests (flash_cuda, math, cudnn, dispatch, memory)" 540 bash -c "
  set -e
  for t in ${attention_tests[*]}; do
    echo \"-- \$t\"; '$root'/tests/kernels/\$t --gtest_brief=1
  done"
want conformance && step "backend conformance (every kernel vs the CPU)" 540 \
  "$root/tests/tensor/backend_conformance_test" --gtest_brief=1 \
      --gtest_filter='BackendConformanceDevicesTest.*'

cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# API errors are the tests' business (out-of-memory is provoked on purpose); memcheck looks for
# bad device memory accesses, racecheck for shared-memory hazards.
for tool in memcheck racecheck; do
  if want $tool; then
    step "compute-sanitizer $tool: cuda_backend_test" 240 \
      "$cs" --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$root/tests/gpu/cuda_backend_test" --gtest_brief=1
    step "compute-sanitizer $tool: cuda_gpt_test (f32, attention)" 240 \
      "$cs" --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$root/tests/gpu/cuda_gpt_test" --gtest_brief=1 \
      --gtest_filter='*InF32:*PlainAttention*'
    step "compute-sanitizer $tool: flash_cuda and math (two cases)" 300 \
      "$cs" --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$root/tests/kernels/attention_cuda_flash_test" --gtest_brief=1 \
      --gtest_filter='*EveryGpuBackend*/bf16_B3_Hq2_Hkv2_Sq7_Sk13_D32_CausalTopLeft:*EveryGpuBackend*/f16_B1_Hq3_Hkv3_Sq77_Sk77_D80_Documents'
    step "compute-sanitizer $tool: backend conformance (3 problems per kernel)" 300 \
      "$cs" --tool "$tool" --report-api-errors no --error-exitcode 99 \
      "$root/tests/tensor/backend_conformance_test" --gtest_brief=1 \
      --gtest_filter='BackendConformanceDevicesTest.EveryDeviceBackendBriefly'
  fi
done

want train && step "train_gpt --device cuda" 300 \
  "$root/examples/train_gpt" --device cuda --steps 200 --log-every 50 --sample 100 \
      --data "$repo/examples/data/corpus.txt" --checkpoint /tmp/train_gpt_cuda.safetensors

if want bench; then
  if [[ -z $python ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python=python3
  fi
  peer=(--torch none)
  [[ -n $python ]] && peer=(--torch "$python" --torch-script "$repo/bench/gpt_cuda/gpt_cuda_torch.py")
  [[ -z $python ]] && echo "gpu-check: no python with torch and CUDA: the bench runs tessel alone"
  size=()
  [[ $quick -eq 1 ]] && size=(--layers 2 --steps 10)
  # bf16 autocast runs attention on the fused kernels; f32 runs it on the reference kernel.
  step "bench: GPT-2 124M, bf16 autocast" 280 "$root/bench/gpt_cuda_bench" --dtype bf16 "${size[@]}" "${peer[@]}"
  step "bench: GPT-2 124M, f32 with TF32" 280 "$root/bench/gpt_cuda_bench" --dtype f32 --tf32 "${size[@]}" "${peer[@]}"
fi

if want attention-bench; then
  if [[ -z $python ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python=python3
  fi
  peer=(--torch none)
  [[ -n $python ]] && peer=(--torch "$python" --torch-script "$repo/bench/attention_cuda/sdpa_torch_peer.py")
  [[ -z $python ]] && echo "gpu-check: no python with torch and CUDA: the attention bench runs tessel alone"
  lengths=()
  [[ $quick -eq 1 ]] && lengths=(--seq 1024,4096)
  step "bench: attention (flash_cuda, cudnn) beside PyTorch SDPA" 540 \
    "$root/bench/attention_cuda_bench" "${lengths[@]}" "${peer[@]}"
fi

# The parallel stack on CUDA: collectives of the threads backend on device tensors, and DTensor,
# FSDP and TP parity with ranks as threads sharing GPU 0; NCCL at world size 1 (its own test,
# and FSDP runs in fsdp_cuda_test, one of them exported as a trace whose all_gathers must
# overlap device-timed compute spans). nccl_backend_test also runs its two-GPU cases where there
# are two GPUs.
want parallel && step "parallel stack on CUDA (threads backend, DTensor, FSDP, TP, NCCL)" 540 bash -c "
  set -e
  for t in ${parallel_tests[*]} collectives/nccl_backend_test; do
    [[ -x '$root'/tests/\$t ]] || { echo \"-- \$t: not built (no NCCL in this build?)\"; continue; }
    echo \"-- \$t\"; '$root'/tests/\$t --gtest_brief=1
  done"

if want fsdp-bench; then
  if [[ -z $python ]] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python=python3
  fi
  peer=(--torch none)
  [[ -n $python ]] && peer=(--torch "$python" --torch-script "$repo/bench/fsdp_cuda/fsdp_cuda_torch.py")
  [[ -z $python ]] && echo "gpu-check: no python with torch and CUDA: the FSDP bench runs tessel alone"
  size=()
  [[ $quick -eq 1 ]] && size=(--layers 2 --steps 10)
  trace=/tmp/gpu-check-fsdp-trace
  rm -rf "$trace"
  step "bench: FSDP GPT step on one GPU beside PyTorch FSDP2" 400 \
    "$root/bench/fsdp_cuda_bench" "${size[@]}" "${peer[@]}" --trace-dir "$trace"
  # The flight recorder's view of the FSDP run: all_gathers and reduce_scatters with their
  # device-measured spans on each group's track, every group's forward and backward as
  # device-timed spans on the compute track, between each step's phase markers.
  step "tessel-trace export of the FSDP run (Perfetto)" 60 bash -c "
    '$root/flight_recorder/tessel-trace' export '$trace' --perfetto /tmp/gpu-check-fsdp-trace.json &&
    python3 -c \"import json; e = json.load(open('/tmp/gpu-check-fsdp-trace.json'));
e = e['traceEvents'] if isinstance(e, dict) else e;
x = [s for s in e if s.get('ph') == 'X'];
print(sum(s.get('cat') != 'user_span' for s in x), 'collective slices,',
      sum(s.get('cat') == 'user_span' for s in x), 'compute spans; the trace: /tmp/gpu-check-fsdp-trace.json')\""
fi

# Two or more GPUs: train_gpt over NCCL, one process per GPU, started by hand through a shared
# FileStore (the cuda-only build has no gRPC, so no tessel-run): FSDP, then FSDP x TP.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if want multi-gpu; then
  if [[ ${gpus:-0} -ge 2 ]]; then
    for layout in "--dp-shard 2" "--dp-shard 1 --tp 2"; do
      step "train_gpt on 2 GPUs over NCCL ($layout)" 300 bash -c "
        store=\$(mktemp -d); pids=()
        for r in 0 1; do
          RANK=\$r LOCAL_RANK=\$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 TESSEL_STORE_DIR=\$store \
            '$root/examples/train_gpt' --device cuda $layout --steps 100 --log-every 50 \
            --sample 0 --data '$repo/examples/data/corpus.txt' \
            --checkpoint /tmp/train_gpt_nccl.safetensors & pids+=(\$!)
        done
        status=0; for p in \${pids[*]}; do wait \$p || status=1; done; exit \$status"
    done
  else
    echo
    echo "== multi-GPU train_gpt: skipped, this host has ${gpus:-0} GPU(s) =="
  fi
fi

echo
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "gpu-check: every step passed"
else
  echo "gpu-check: ${#failed[@]} step(s) failed: ${failed[*]}"
fi
exit ${#failed[@]}
