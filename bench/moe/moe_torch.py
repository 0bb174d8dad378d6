"""PyTorch eager peer of bench/moe: the same MoE layer (router, top-k, per-expert SwiGLU, combine)
forward + backward, timed the same way; prints one line "torch_eager_s <median seconds>".

The common eager implementation (torchtitan's and Hugging Face's reference loops): tokens sorted
by expert, one matmul per expert over its rows, index_add back.
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--top-k", type=int, required=True)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    N, C, F, E, k = a.tokens, a.dim, a.hidden, a.experts, a.top_k
    gate = torch.nn.Linear(C, E, bias=False)
    w_gate = torch.nn.Parameter(torch.randn(E, C, F) / C**0.5)
    w_up = torch.nn.Parameter(torch.randn(E, C, F) / C**0.5)
    w_down = torch.nn.Parameter(torch.randn(E, F, C) / F**0.5)
    x = torch.randn(N, C, requires_grad=True)

    def step():
        scores = torch.sigmoid(gate(x).float())
        weights, experts = torch.topk(scores, k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E).tolist()
        token_of = order // k
        xs = x[token_of]
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                h = xs[start:start + n]
                y = torch.nn.functional.silu(h @ w_gate[e]) * (h @ w_up[e])
                out[start:start + n] = y @ w_down[e]
            start += n
        y = torch.zeros_like(x).index_add(0, token_of, out * weights.reshape(-1)[order, None])
        y.sum().backward()

    for _ in range(2):
        step()
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    print(f"torch_version {torch.__version__}")
    print(f"torch_eager_s {statistics.median(times):.6e}")


if __name__ == "__main__":
    main()
