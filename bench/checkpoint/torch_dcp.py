"""torch.distributed.checkpoint on CPU over Gloo, the peer of bench/checkpoint_io (bench_checkpoint).

The same state as tessel's: --tensors f32 tensors of (--rows, --cols), each a DTensor sharded on
dim 0 over a 1-D mesh of --np processes. dcp.save with FileSystemWriter's defaults (one file per
rank, files fsync'ed), then the files are evicted from the page cache (posix_fadvise DONTNEED, as
tessel's bench does for its own), then dcp.load into the same DTensors. Prints:
  torch <version>
  dcp <save seconds> <load seconds> <bytes>
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def evict(folder):
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def worker(rank, args, store_file, out_dir, result_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=args.np)
    mesh = init_device_mesh("cpu", (args.np,))
    state = {
        f"t{i}": distribute_tensor(torch.full((args.rows, args.cols), float(i)), mesh, [Shard(0)])
        for i in range(args.tensors)
    }
    dist.barrier()
    start = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(out_dir))
    dist.barrier()
    save_s = time.perf_counter() - start
    if rank == 0:
        evict(out_dir)
    for t in state.values():
        t.to_local().zero_()
    dist.barrier()
    start = time.perf_counter()
    dcp.load(state, storage_reader=dcp.FileSystemReader(out_dir))
    dist.barrier()
    load_s = time.perf_counter() - start
    assert all(float(t.to_local()[0, 0]) == i for i, t in enumerate(state.values()) if
               t.to_local().numel() > 0)
    if rank == 0:
        nbytes = args.tensors * args.rows * args.cols * 4
        with open(result_file, "w") as f:
            f.write(f"dcp {save_s} {load_s} {nbytes}\n")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    print(f"torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = os.path.join(tmp, "result")
        mp.spawn(worker, args=(args, os.path.join(tmp, "store"), os.path.join(tmp, "ckpt"), result),
                 nprocs=args.np)
        with open(result) as f:
            sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
