"""PyTorch's DTensor.redistribute over Gloo, the peer of bench/dtensor_redistribute.

Spawns --np processes (Gloo over loopback), builds a 1-D DeviceMesh and times, per transition
and size, DTensor.redistribute and the raw torch.distributed collective it runs, alternating
the two in rounds between barriers. Rank 0 prints one JSON object per line:
  {"transition": "S0->R", "bytes": 4194304, "dtensor_s": ..., "raw_s": ...}
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard


def timed(fn, iters):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def calls_for(fn):
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    per = torch.tensor([(time.perf_counter() - start) / 3])
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    return int(min(max(0.02 / max(per.item(), 1e-9), 3), 1000))


def run(rank, world, init_file, sizes, rounds, out_path):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    results = []
    for numel in sizes:
        # rows a multiple of world^2, so every shard splits evenly again for all_to_all.
        # As bench/dtensor_redistribute.cc: columns a multiple of world too, rows rounded up.
        n2 = world * world
        near = n2 * max(1, numel // (64 * n2))
        cols = world * -(-max(1, numel // near) // world)
        rows = n2 * -(-numel // (cols * n2))
        shape = (rows, cols)
        full = torch.randn(shape)
        local_rows = rows // world
        shard = full[rank * local_rows:(rank + 1) * local_rows].contiguous()
        local_cols = cols // world
        column_shard = full[:, rank * local_cols:(rank + 1) * local_cols].contiguous()
        transitions = {
            "S0->R": (lambda: DTensor.from_local(shard, mesh, [Shard(0)], run_check=False),
                      [Replicate()],
                      lambda: dist.all_gather_into_tensor(torch.empty(shape), shard)),
            "P->R": (lambda: DTensor.from_local(full, mesh, [Partial()], run_check=False),
                     [Replicate()],
                     lambda: dist.all_reduce(full.clone())),
            "P->S0": (lambda: DTensor.from_local(full, mesh, [Partial()], run_check=False),
                      [Shard(0)],
                      lambda: dist.reduce_scatter_tensor(torch.empty(shard.shape), full)),
            "S0->S1": (lambda: DTensor.from_local(shard, mesh, [Shard(0)], run_check=False),
                       [Shard(1)],
                       lambda: dist.all_to_all_single(torch.empty(shard.shape), shard)),
            "S1->S0": (lambda: DTensor.from_local(column_shard, mesh, [Shard(1)], run_check=False),
                       [Shard(0)],
                       lambda: dist.all_to_all_single(torch.empty(shard.shape), shard)),
            "R->S0": (lambda: DTensor.from_local(full, mesh, [Replicate()], run_check=False),
                      [Shard(0)],
                      lambda: full[rank * local_rows:(rank + 1) * local_rows].contiguous()),
        }
        for name, (make, target, raw) in transitions.items():
            x = make()
            ours = lambda: x.redistribute(mesh, target).to_local()
            try:
                iters = calls_for(raw)
                ours()
            except Exception as e:  # a collective Gloo lacks
                results.append({"transition": name, "bytes": full.numel() * 4,
                                "error": str(e).splitlines()[0][:120]})
                continue
            best_ours, best_raw = float("inf"), float("inf")
            for r in range(rounds):
                pair = [(ours, "o"), (raw, "r")] if r % 2 else [(raw, "r"), (ours, "o")]
                for fn, tag in pair:
                    t = timed(fn, iters)
                    if tag == "o":
                        best_ours = min(best_ours, t)
                    else:
                        best_raw = min(best_raw, t)
            results.append({"transition": name, "bytes": full.numel() * 4,
                            "dtensor_s": best_ours, "raw_s": best_raw})
    if rank == 0:
        with open(out_path, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--sizes", default="64,262144,1048576,4194304")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.jsonl")
        mp.spawn(run, args=(a.np, os.path.join(tmp, "init"), sizes, a.rounds, out),
                 nprocs=a.np, join=True)
        sys.stdout.write(f"torch {torch.__version__}\n")
        sys.stdout.write(open(out).read())


if __name__ == "__main__":
    main()
