"""PyTorch FSDP2 on one GPU (world size 1), the peer of bench/fsdp_cuda/fsdp_cuda_bench.

The model, initial weights, token batches and optimizer of bench/gpt_cuda/gpt_cuda_torch.py
(imported from there), trained three ways, one per --mode:
  single        the plain model on the device;
  fsdp2         fully_shard on every block and then the root, over a world of one rank
                (NCCL on a GPU, Gloo on the CPU): what FSDP2 costs when nothing needs sending;
  fsdp2-nocomm  the same over PyTorch's fake process group, whose collectives move nothing:
                fsdp2 minus this is the communication FSDP2 leaves exposed.
bf16 means autocast to bf16 with f32 parameters (no MixedPrecisionPolicy), as tessel's side.

Prints one line: torch <mode> <median seconds per step> <peak allocated bytes> <loss per step...>
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt_cuda"))
import gpt_cuda_torch as gpt  # noqa: E402  (the GPT, read_safetensors, the training loop)


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4, 2.5
    return fully_shard


def init_world(mode, cuda, device):
    if mode == "fsdp2-nocomm":
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    else:
        path = os.path.join(tempfile.mkdtemp(), "rendezvous")
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{path}",
                                rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(device.type, (1,))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["single", "fsdp2", "fsdp2-nocomm"], default="fsdp2")
    ap.add_argument("--init", required=True)
    ap.add_argument("--tokens", required=True)
    for name, default in [("batch", 8), ("seq", 1024), ("layers", 12), ("heads", 12),
                          ("embd", 768), ("vocab", 50304), ("steps", 20), ("warmup", 5)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--attention", choices=["plain", "sdpa"], default="sdpa")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    model = gpt.GPT(a.vocab, a.seq, a.layers, a.heads, a.embd, a.attention == "plain")
    missing, unexpected = model.load_state_dict(gpt.read_safetensors(a.init), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.to(device)
    if a.mode != "single":
        mesh = init_world(a.mode, cuda, device)
        fully_shard = fully_shard_fn()
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    options = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **options)
    except (RuntimeError, TypeError):  # fused AdamW without DTensor support
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **options)

    gpt.train_and_report(a, device, model, model, opt)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
