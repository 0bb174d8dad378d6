# PyTorch's side of bench/gpt_train: the same GPT (GPT-2 layout, nanoGPT's names), loaded from
# the initial weights tessel wrote, trained on the same batches, in four modes (eager and
# torch.compile, each f32 and bf16 autocast), each with its own copy of the model and optimizer.
# Driven one command per line on stdin, one answer per line on stdout:
#   load DIR V T C L H B NBATCHES  -> "ok <f32 loss> <bf16 loss>" of batch 0 before training
#   warm MODE N                    -> "ok" after N steps (torch.compile compiles here), or
#                                     "error <what>" when the mode cannot run
#   steps MODE N                   -> "wall:cpu ..." seconds of each of N training steps
# A training step: forward and loss (under autocast in bf16 modes), backward, gradient clipping
# to 1.0, fused AdamW, zero_grad — as bench/gpt_train does on tessel's side.
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c)
        self.mlp.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, c, layers, heads):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, c), wpe=nn.Embedding(block, c),
            h=nn.ModuleList(Block(c, heads) for _ in range(layers)), ln_f=nn.LayerNorm(c)))

    def forward(self, idx, targets):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1]))
        for block in tr.h:
            x = block(x)
        logits = F.linear(tr.ln_f(x), tr.wte.weight)  # the LM head is tied to wte
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


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
        self.model = GPT(*config)
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
            vocab, block, c, layers, heads, batch, count = (int(v) for v in cmd[2:9])
            state = load_safetensors(folder + "/init.safetensors")
            n = batch * block
            data = torch.from_file(folder + "/data.bin", size=2 * n * count, dtype=torch.int64)
            batches = [(data[(2 * i) * n:(2 * i + 1) * n].view(batch, block).clone(),
                        data[(2 * i + 1) * n:(2 * i + 2) * n].view(batch, block).clone())
                       for i in range(count)]
            config = (vocab, block, c, layers, heads)
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
