"""PyTorch's side of bench/attention_cuda: F.scaled_dot_product_attention on the GPU with one
backend forced (FLASH_ATTENTION or CUDNN_ATTENTION), timed when the bench asks, so that its
rounds alternate with tessel's on the same GPU.

Protocol, one command per line on stdin, one answer per line on stdout:
  load B H S D CAUSAL [HKV]
                        -> makes q and the output gradient (bf16, (B, H, S, D)) and k, v
                           ((B, HKV, S, D); HKV defaults to H, fewer is grouped-query attention,
                           run with enable_gqa) with the bench's formula, so both processes hold
                           identical values; answers
                           "ok flash=<sum of out> cudnn=<sum of out>" ("-" where unsupported)
  time BACKEND MODE N   -> BACKEND flash|cudnn, MODE fwd|fb; N calls between CUDA events after
                           one warm-up call the first time; answers the milliseconds per call, or
                           "unsupported <reason>"
End of input ends the process.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def values(n, salt, scale):
    """The bench's inputs: element i is ((i * 2654435761 + salt) mod 2^24) / 2^24 * 2 - 1, times
    scale, computed exactly in f32 and rounded to bf16 (tessel does the same on the host)."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    u = ((i * 2654435761 + salt) % (1 << 24)).to(torch.float32) / float(1 << 24)
    return ((u * 2 - 1) * scale).to(torch.bfloat16)


def sdpa(q, k, v, st):
    """F.scaled_dot_product_attention, with enable_gqa only for grouped rows (older torch lacks
    the argument; they then answer "unsupported")."""
    if st["gqa"]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=st["causal"], enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=st["causal"])


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_name()
    print("ready", torch.__version__, "cuda", torch.version.cuda, "cudnn",
          torch.backends.cudnn.version(), dev.replace(" ", "_"), flush=True)
    state = {}
    warm = set()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "load":
            b, h, s, d, causal = (int(x) for x in cmd[1:6])
            h_kv = int(cmd[6]) if len(cmd) > 6 else h
            shape, kv_shape = (b, h, s, d), (b, h_kv, s, d)
            q, do = (values(b * h * s * d, salt, 1.0).view(shape) for salt in (1, 4))
            k, v = (values(b * h_kv * s * d, salt, 1.0).view(kv_shape) for salt in (2, 3))
            qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
            state = dict(q=q, k=k, v=v, do=do, qg=qg, kg=kg, vg=vg, causal=bool(causal),
                         gqa=h_kv != h)
            warm.clear()
            sums = []
            for name, backend in BACKENDS.items():
                try:
                    with sdpa_kernel(backend), torch.no_grad():
                        out = sdpa(q, k, v, state)
                    sums.append(f"{name}={out.double().sum().item()!r}")
                except (RuntimeError, TypeError):
                    sums.append(f"{name}=-")
            print("ok", " ".join(sums), flush=True)
        elif cmd[0] == "time":
            name, mode, calls = cmd[1], cmd[2], int(cmd[3])
            st = state

            def fwd():
                with torch.no_grad():
                    sdpa(st["q"], st["k"], st["v"], st)

            def fb():
                st["qg"].grad = st["kg"].grad = st["vg"].grad = None
                out = sdpa(st["qg"], st["kg"], st["vg"], st)
                out.backward(st["do"])

            fn = fwd if mode == "fwd" else fb
            try:
                with sdpa_kernel(BACKENDS[name]):
                    if (name, mode) not in warm:
                        fn()
                        warm.add((name, mode))
                    torch.cuda.synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(calls):
                        fn()
                    end.record()
                    end.synchronize()
                print(start.elapsed_time(end) / calls, flush=True)
            except (RuntimeError, TypeError) as e:
                print("unsupported", str(e).splitlines()[0][:120].replace(" ", "_"), flush=True)
        else:
            break


if __name__ == "__main__":
    main()
