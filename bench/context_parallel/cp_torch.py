# PyTorch's side of bench/context_parallel at cp = 1 (one process, one thread), for the same
# global sequence: causal F.scaled_dot_product_attention forward + backward, and a training step
# of the same GPT (GPT-2 layout). Prints "torch <version>", then "torch attn <tok/s> <seconds>" and
# "torch train <tok/s> <seconds>" (medians).
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
for name, default in [("heads", 8), ("attn-seq", 4096), ("seq", 2048), ("layers", 2),
                      ("embd", 128), ("train-heads", 4), ("vocab", 256), ("batch", 1),
                      ("reps", 3), ("steps", 3)]:
    p.add_argument("--" + name, type=int, default=default)
a = p.parse_args()
torch.set_num_threads(1)
print("torch", torch.__version__, flush=True)


def attention():
    times = []
    for rep in range(a.reps + 1):
        q, k, v = (torch.randn(1, a.heads, a.attn_seq, 64, requires_grad=True) for _ in range(3))
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        if rep > 0:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(f"torch attn {a.attn_seq / s:.1f} {s:.6f}", flush=True)


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab, a.embd), nn.Embedding(a.seq, a.embd)
        self.h = nn.ModuleList(Block(a.embd, a.train_heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.embd)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def train():
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    times = []
    for step in range(a.steps + 1):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step > 0:
            times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    print(f"torch train {a.batch * a.seq / s:.1f} {s:.6f}", flush=True)


attention()
train()
