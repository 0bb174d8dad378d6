#!/usr/bin/env bash
# Sets everything up, builds what the demo needs, and runs the main job: a GPT trained by four
# workers on a 2x2 (dp_shard, tp) mesh — FSDP over dp_shard, every layer split over tp —
# launched and supervised by tessel-run (Gloo collectives bootstrapped through the launcher's
# authenticated store), after a look at a 2x4 device mesh and the same training on one process,
# whose loss curve the four workers reproduce; then draws both runs' logs into one picture
# (build/release/demo-runs.svg, tessel-plot). Both runs train on real text: the Debian Reference
# (GPL-2+, Debian's debian-reference-en; scripts/real_corpus.sh), tokenized byte-level into token
# shards by tessel-tokenize and read by the distributed loader (docs/data.md).
#
#   scripts/demo.sh                  defaults: 400 steps
#   scripts/demo.sh --steps 100      extra arguments go to both runs of examples/train_gpt
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target tessel-run train_gpt mesh_demo tessel-trace tessel-plot \
  tessel-tokenize

echo
echo "== A 2x4 (dp, tp) device mesh over 8 ranks (threads), one all_reduce per dimension =="
build/release/examples/mesh_demo --threads 8 --shape 2x4 | head -6
echo "..."
cd build/release  # the checkpoint (train_gpt.safetensors) lands here
echo
echo "== The corpus: the Debian Reference (GPL-2+), tokenized into shards by tessel-tokenize =="
../../scripts/real_corpus.sh corpus bin/tessel-tokenize
data=(--data 'corpus/shards/train_*.bin' --val-data 'corpus/shards/val_*.bin' --prompt 'The ')
echo
echo "== The reference: the same GPT and batches on one process =="
examples/train_gpt "${data[@]}" --threads 2 --log-every 50 --eval-every 100 --sample 0 \
  --checkpoint train_gpt_single.safetensors --log-json demo-single.jsonl "$@" |
  grep -E "^(step|trained)"
echo
echo "== GPT training on a 2x2 (dp_shard, tp) mesh: tessel-run --standalone --nproc-per-node 4 =="
echo "(the tools are in $PWD/bin: export PATH=\"$PWD/bin:\$PATH\" to run them by name)"
launcher/tessel-run --standalone --nproc-per-node 4 examples/train_gpt "${data[@]}" --threads 1 \
  --dp-shard 2 --tp 2 --log-every 50 --eval-every 100 --log-json demo-sharded.jsonl "$@"
echo
echo "== Both runs in one picture: tessel-plot =="
bin/tessel-plot demo-single.jsonl demo-sharded.jsonl --label "one process" \
  --label "2x2 (dp_shard, tp) mesh" -o demo-runs.svg
echo "(open $PWD/demo-runs.svg in a browser)"
