"""PyTorch FSDP2 (fully_shard) on CPU over Gloo, the peer of bench/fsdp_train.

The same GPT as tessel's nn::GPT (GPT-2 layout: token and position embeddings, pre-norm blocks
with a fused qkv projection and a tanh-GELU MLP, a final LayerNorm, the LM head tied to the
token embedding), the same config, global batch and world. Prints one line per setup:
  torch <setup> <tokens/s> <seconds per step>
for setups: single (1 process, no FSDP, --np threads), single1 (the same on 1 thread), fsdp1
(FSDP over 1 process, 1 thread), fsdp (FSDP over --np processes), ddp (DistributedDataParallel
over --np processes). fsdp1 - single1 is FSDP's own host cost per step.
"""
import argparse
import math
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


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.m_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.m_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def train(model, rank, world, a, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    rows = a.batch // world
    times = []
    for step in range(steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        x = tokens[rank * rows:(rank + 1) * rows, :-1]
        y = tokens[rank * rows:(rank + 1) * rows, 1:]
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return times[a.warmup:]


def make(a):
    torch.manual_seed(a.seed)
    return GPT(a.vocab, a.seq, a.layers, a.heads, a.embd)


def worker(rank, world, init, a, setup, out):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    model = make(a)
    if setup.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (world,))
        for b in model.h:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    times = train(model, rank, world, a, a.steps + a.warmup)
    if rank == 0:
        with open(out, "w") as f:
            f.write(" ".join(str(t) for t in times))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("np", 2), ("vocab", 256), ("seq", 256), ("layers", 4), ("heads", 4),
                          ("embd", 256), ("batch", 8), ("steps", 6), ("warmup", 2),
                          ("threads", 1), ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--setups", default="single,single1,fsdp1,fsdp,ddp")
    a = p.parse_args()
    print(f"torch {torch.__version__}", flush=True)
    tokens = a.batch * a.seq
    for setup in a.setups.split(","):
        if setup in ("single", "single1"):
            # single: the whole machine, as the multi-process setups use; single1: one thread.
            torch.set_num_threads(a.threads * (a.np if setup == "single" else 1))
            times = train(make(a), 0, 1, a, a.steps + a.warmup)
        else:
            world = 1 if setup == "fsdp1" else a.np
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "times")
                mp.spawn(worker, args=(world, os.path.join(tmp, "init"), a, setup, out),
                         nprocs=world, join=True)
                times = [float(t) for t in open(out).read().split()]
        med = statistics.median(times)
        print(f"torch {setup} {tokens / med:.1f} {med:.6f}", flush=True)


if __name__ == "__main__":
    main()
