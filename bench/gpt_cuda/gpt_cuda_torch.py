"""PyTorch GPT-2 training on one GPU, the peer of bench/gpt_cuda/gpt_cuda_bench.

The same model as tessel's nn::GPT (nanoGPT's GPT-2: token and position embeddings, pre-norm
blocks with a fused qkv projection and a tanh-GELU MLP, a final LayerNorm, the LM head tied to
the token embedding, biases, dropout 0), started from tessel's initial weights (--init, a
safetensors file with tessel's parameter names, which are nanoGPT's) and trained on tessel's
token batches (--tokens, int32) with the same optimizer: fused AdamW (lr 6e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on every parameter), gradient clipping at 1.0, bf16 autocast with
f32 master weights (--dtype bf16) or f32 (--tf32 for TF32 matmuls).

--attention plain computes softmax(q k^T / sqrt(d) + causal mask) v with tensor ops (the
counterpart of tessel's math backend, which it runs for f32); sdpa uses
F.scaled_dot_product_attention (flash attention).

Prints one line: torch <mode> <median seconds per step> <peak allocated bytes> <loss per step...>
"""
import argparse
import json
import math
import statistics
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H, plain):
        super().__init__()
        self.H, self.plain = H, plain
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.H, C // self.H).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        if self.plain:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, H, plain):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, H, plain)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C, plain):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C),
            wpe=nn.Embedding(T, C),
            h=nn.ModuleList([Block(C, H, plain) for _ in range(L)]),
            ln_f=nn.LayerNorm(C)))

    def forward(self, idx, targets):
        T = idx.shape[1]
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(T, device=idx.device))
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # tied LM head
        # Inside the model, as llm.c's train_gpt2.py: compiled with it; f32 under autocast.
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def read_safetensors(path):
    """{name: f32 tensor} from a safetensors file (f32 entries only, as tessel writes them)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", f"{name}: {meta['dtype']}"
        begin, end = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).view(meta["shape"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--init", required=True)
    ap.add_argument("--tokens", required=True)
    for name, default in [("batch", 16), ("seq", 1024), ("layers", 12), ("heads", 12),
                          ("embd", 768), ("vocab", 50304), ("steps", 20), ("warmup", 5)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--attention", choices=["plain", "sdpa"], default="plain")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    model = GPT(a.vocab, a.seq, a.layers, a.heads, a.embd, a.attention == "plain")
    missing, unexpected = model.load_state_dict(read_safetensors(a.init), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    train_and_report(a, device, model, step_fn, opt)


def train_and_report(a, device, model, step_fn, opt):
    """Trains on the token batches of --tokens (each step ends with the loss read on the host)
    and prints the result line; also the loop of bench/fsdp_cuda/fsdp_cuda_torch.py."""
    cuda = device.type == "cuda"
    per_step = a.batch * (a.seq + 1)
    tokens = torch.from_file(a.tokens, dtype=torch.int32, size=(a.steps + a.warmup) * per_step)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for step in range(a.steps + a.warmup):
        batch = tokens[step * per_step:(step + 1) * per_step].view(a.batch, a.seq + 1)
        batch = batch.to(device, dtype=torch.int64)
        start = time.perf_counter()
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    print("torch", a.mode, statistics.median(times), peak,
          " ".join(f"{l:.6f}" for l in losses), flush=True)


if __name__ == "__main__":
    main()
