"""PyTorch torch.distributed.pipelining on CPU over Gloo, the peer of bench/pipeline.

The GPT of bench/tp/torch_tp.py (tessel's nn::GPT layout; the head untied, since a parameter
cannot be shared across pipeline stages here) cut into --pp stages of --layers / --pp blocks each,
the embeddings on the first and ln_f and the head on the last, one stage per process
(PipelineStage), run by ScheduleGPipe or Schedule1F1B with --microbatches micro-batches and a
cross-entropy loss, then AdamW on every stage. Each setup (a schedule) prints
  torch <schedule> <tokens/s> <seconds per step>
and, per stage, the host time per micro-batch of each step:
  torch_stage <schedule> <stage> <seconds per micro-batch>
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tp"))
from torch_tp import Block  # noqa: E402  (the same block as the TP peer's)


class Stage(nn.Module):
    def __init__(self, a, index):
        super().__init__()
        first, last = index == 0, index == a.pp - 1
        self.wte = nn.Embedding(a.vocab, a.embd) if first else None
        self.wpe = nn.Embedding(a.seq, a.embd) if first else None
        self.h = nn.ModuleList([Block(a.embd, a.heads) for _ in range(a.layers // a.pp)])
        self.ln_f = nn.LayerNorm(a.embd) if last else None
        self.lm_head = nn.Linear(a.embd, a.vocab, bias=False) if last else None

    def forward(self, x):
        if self.wte is not None:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for b in self.h:
            x = b(x)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))
        return x


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def worker(rank, world, init, a, schedule_name, out):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    torch.manual_seed(a.seed + rank)
    module = Stage(a, rank)
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    kind = Schedule1F1B if schedule_name == "1f1b" else ScheduleGPipe
    schedule = kind(stage, n_microbatches=a.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(a.steps + a.warmup):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        opt.step()
        times.append(time.perf_counter() - start)
    times = times[a.warmup:]
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(str(t) for t in times))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("pp", 4), ("microbatches", 8), ("vocab", 256), ("seq", 128),
                          ("layers", 4), ("heads", 4), ("embd", 128), ("batch", 16),
                          ("steps", 6), ("warmup", 2), ("seed", 1)]:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=default)
    p.add_argument("--schedules", default="gpipe,1f1b")
    a = p.parse_args()
    print(f"torch {torch.__version__}", flush=True)
    tokens = a.batch * a.seq
    for name in a.schedules.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "times")
            mp.spawn(worker, args=(a.pp, os.path.join(tmp, "init"), a, name, out), nprocs=a.pp,
                     join=True)
            per_rank = [[float(t) for t in open(f"{out}.{r}").read().split()]
                        for r in range(a.pp)]
        med = statistics.median(per_rank[0])
        print(f"torch {name} {tokens / med:.1f} {med:.6f}", flush=True)
        for r in range(a.pp):
            print(f"torch_stage {name} {r} {statistics.median(per_rank[r]) / a.microbatches:.6f}",
                  flush=True)


if __name__ == "__main__":
    main()
