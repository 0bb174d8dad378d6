#!/usr/bin/env bash
# Sets everything up, builds what the demo needs, and runs the main job: a GPT trained by two
# workers that shard it with FSDP, launched and supervised by tessel-run (Gloo collectives
# bootstrapped through the launcher's authenticated store), after a look at a 2x4 device mesh.
#
#   scripts/demo.sh                  defaults: 400 steps
#   scripts/demo.sh --steps 100      extra arguments go to examples/train_gpt
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target tessel-run train_gpt mesh_demo tessel-trace

echo
echo "== A 2x4 (dp, tp) device mesh over 8 ranks (threads), one all_reduce per dimension =="
build/release/examples/mesh_demo --threads 8 --shape 2x4 | head -6
echo "..."
echo
echo "== GPT training, FSDP over 2 workers: tessel-run --standalone --nproc-per-node 2 =="
cd build/release  # the checkpoint (train_gpt.safetensors) lands here
exec launcher/tessel-run --standalone --nproc-per-node 2 examples/train_gpt --threads 1 "$@"
