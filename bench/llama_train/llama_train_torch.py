# PyTorch's side of bench/llama_train: the same Llama (Hugging Face LlamaForCausalLM's layout and
# names, written out in plain PyTorch: RMSNorm, rotate_half RoPE, SwiGLU, grouped-query SDPA
# without repeating K/V), loaded from the initial weights and RoPE frequencies tessel wrote,
# trained on the same batches in four modes (eager and torch.compile, each f32 and bf16
# autocast), each with its own copy of the model and optimizer. Driven one command per line on
# stdin, one answer per line on stdout:
#   load DIR V DIM L H KV HD FFN TIED EPS T B NBATCHES
#                                  -> "ok <f32 loss> <bf16 loss>" of batch 0 before training
#   warm MODE N                    -> "ok" after N steps (torch.compile compiles here), or
#                                     "error <what>" when the mode cannot run
#   steps MODE N                   -> "wall:cpu ..." seconds of each of N training steps
# A training step: forward and loss (under autocast in bf16 modes), backward, gradient clipping
# to 1.0, fused AdamW, zero_grad — as bench/llama_train does on tessel's side.
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim, hidden, eps):
        super().__init__()
        self.self_attn = Attention(dim, heads, kv_heads, head_dim)
        self.mlp = MLP(dim, hidden)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, head_dim, hidden, tied, eps, inv_freq):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, dim)
        self.model.layers = nn.ModuleList(
            Layer(dim, heads, kv_heads, head_dim, hidden, eps) for _ in range(layers))
        self.model.norm = RMSNorm(dim, eps)
        self.tied = tied
        if not tied:
            self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        # As Hugging Face: f32 angles position * frequency, then cos and sin of (angles, angles).
        freqs = torch.arange(t, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        logits = F.linear(x, self.model.embed_tokens.weight) if self.tied else self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", entry
        begin, end = entry["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=torch.float32).view(entry["shape"]).clone()
    return out


class Trainer:
    def __init__(self, state, config, batches, compiled, bf16):
        self.model = Llama(*config)
        self.model.load_state_dict(state, strict=True)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                     weight_decay=0.1, fused=True)
        self.fn = torch.compile(self.model) if compiled else self.model
        self.bf16 = bf16
        self.batches = batches
        self.next = 0

    def step(self):
        x, y = self.batches[self.next % len(self.batches)]
        self.next += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main():
    threads = int(sys.argv[1])
    if threads > 0:
        torch.set_num_threads(threads)
    print("ready", torch.__version__, torch.backends.cpu.get_cpu_capability(),
          torch.get_num_threads(), flush=True)
    trainers = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "load":
            folder = cmd[1]
            vocab, dim, layers, heads, kv_heads, head_dim, hidden, tied = (int(v) for v in cmd[2:10])
            eps = float(cmd[10])
            block, batch, count = (int(v) for v in cmd[11:14])
            state = load_safetensors(folder + "/init.safetensors")
            inv_freq = torch.from_file(folder + "/inv_freq.bin", size=head_dim // 2,
                                       dtype=torch.float32).clone()
            n = batch * block
            data = torch.from_file(folder + "/data.bin", size=2 * n * count, dtype=torch.int64)
            batches = [(data[(2 * i) * n:(2 * i + 1) * n].view(batch, block).clone(),
                        data[(2 * i + 1) * n:(2 * i + 2) * n].view(batch, block).clone())
                       for i in range(count)]
            config = (vocab, dim, layers, heads, kv_heads, head_dim, hidden, bool(tied), eps,
                      inv_freq)
            for mode in ("eager_f32", "eager_bf16", "compile_f32", "compile_bf16"):
                trainers[mode] = Trainer(state, config, batches, mode.startswith("compile"),
                                         mode.endswith("bf16"))
            losses = []
            with torch.no_grad():
                for bf16 in (False, True):
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        losses.append(trainers["eager_f32"].model(*batches[0]).item())
            print("ok", *(repr(v) for v in losses), flush=True)
        elif cmd[0] == "warm":
            try:  # torch.compile needs a C++ compiler and may fail; the other modes still run
                for _ in range(int(cmd[2])):
                    trainers[cmd[1]].step()
                print("ok", flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the bench, which skips the mode
                print("error", type(e).__name__, " ".join(str(e).split())[:300], flush=True)
        elif cmd[0] == "steps":
            trainer, count = trainers[cmd[1]], int(cmd[2])
            times = []
            for _ in range(count):
                t0, c0 = time.perf_counter(), time.process_time()
                trainer.step()
                times.append(f"{time.perf_counter() - t0!r}:{time.process_time() - c0!r}")
            print(" ".join(times), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
