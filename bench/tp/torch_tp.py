"""PyTorch tensor parallelism (parallelize_module) on CPU over Gloo, the peer of bench/tp_train.

The GPT of bench/fsdp/torch_fsdp.py (tessel's nn::GPT layout) with the plan tessel's
gpt_tp_plan() writes out, in PyTorch's styles:
  wte                     RowwiseParallel(input_layouts=Replicate())   (vocabulary-parallel)
  h.*.q, h.*.k, h.*.v     ColwiseParallel()    (tessel splits its fused c_attn per section;
                                                 PyTorch's ColwiseParallel cannot, so the
                                                 projection is three Linears: the same FLOPs)
  h.*.c_proj, h.*.m_proj  RowwiseParallel()
  h.*.c_fc                ColwiseParallel()
  lm_head                 ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
                          its loss under loss_parallel() (the head is untied here: a DTensor
                          weight cannot feed F.linear next to a plain activation)
Gradients are clipped to norm 1 as in tessel's bench (PyTorch's clip_grad_norm_ under TP by a
helper: its own refuses a mix of DTensor and plain gradients). Prints one line per setup:  torch <setup> <tokens/s> <seconds per step>
for setups tp (TP over --tp processes), dp_tp (FSDP2 over dp_shard --dp after TP over --tp),
fsdp (FSDP2 over --dp * --tp processes).
"""
import argparse
import os
import statistics
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
        self.H, self.D = H, C // H
        self.ln_1 = nn.LayerNorm(C)
        self.q = nn.Linear(C, C)
        self.k = nn.Linear(C, C)
        self.v = nn.Linear(C, C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.m_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.ln_1(x)
        # Local heads: under TP each projection gives this rank's columns.
        heads = lambda t: t.view(B, T, -1, self.D).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)),
                                           is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.m_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def tensor_parallel(model, tp_mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.h)):
        for name in ("q", "k", "v", "c_fc"):
            plan[f"h.{i}.{name}"] = ColwiseParallel()
        for name in ("c_proj", "m_proj"):
            plan[f"h.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, tp_mesh, plan)


def clip_grad_norm(params, max_norm):
    """clip_grad_norm_ over a mix of DTensor and plain gradients (PyTorch's own refuses the mix
    under TP): each DTensor gradient's norm made whole, then one scale for all."""
    from torch.distributed.tensor import DTensor
    norms = []
    for p in params:
        if p.grad is not None:
            n = p.grad.norm()
            norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = torch.stack(norms).norm()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)
    return total


def train(model, dp_rank, dp_size, a, loss_parallel_on):
    from torch.distributed.tensor.parallel import loss_parallel
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    rows = a.batch // dp_size
    times = []
    for step in range(a.steps + a.warmup):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        x = tokens[dp_rank * rows:(dp_rank + 1) * rows, :-1]
        y = tokens[dp_rank * rows:(dp_rank + 1) * rows, 1:]
        dist.barrier()
        start = time.perf_counter()
        logits = model(x)
        if loss_parallel_on:
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
                loss.backward()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
        if loss_parallel_on:
            clip_grad_norm(list(model.parameters()), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return times[a.warmup:]


def worker(rank, world, init, a, setup, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(a.seed)
    model = GPT(a.vocab, a.seq, a.layers, a.heads, a.embd)
    dp_rank, dp_size = 0, 1
    if setup == "tp":
        tensor_parallel(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))
    elif setup == "dp_tp":
        mesh = init_device_mesh("cpu", (a.dp, a.tp), mesh_dim_names=("dp_shard", "tp"))
        tensor_parallel(model, mesh["tp"])
        for b in model.h:
            fully_shard(b, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
        dp_rank, dp_size = mesh["dp_shard"].get_local_rank(), a.dp
    else:  # fsdp
        mesh = init_device_mesh("cpu", (world,))
        for b in model.h:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        dp_rank, dp_size = rank, world
    times = train(model, dp_rank, dp_size, a, setup != "fsdp")
    if rank == 0:
        with open(out, "w") as f:
            f.write(" ".join(str(t) for t in times))
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("tp", 2), ("dp", 2), ("vocab", 256), ("seq", 256), ("layers", 4),
                          ("heads", 4), ("embd", 256), ("batch", 8), ("steps", 6),
                          ("warmup", 2), ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--setups", default="tp,dp_tp,fsdp")
    a = p.parse_args()
    print(f"torch {torch.__version__}", flush=True)
    tokens = a.batch * a.seq
    for setup in a.setups.split(","):
        world = a.tp if setup == "tp" else a.dp * a.tp
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "times")
            mp.spawn(worker, args=(world, os.path.join(tmp, "init"), a, setup, out),
                     nprocs=world, join=True)
            times = [float(t) for t in open(out).read().split()]
        med = statistics.median(times)
        print(f"torch {setup} {tokens / med:.1f} {med:.6f}", flush=True)


if __name__ == "__main__":
    main()
