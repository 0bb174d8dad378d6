"""Runs small PyTorch jobs over Gloo that hang in known ways and keeps their flight-recorder
dumps as test fixtures for tessel-trace (scripts/pytorch_fr_fixtures.sh runs this in a venv).

Every scenario starts WORLD ranks as processes. Collectives time out after 60 s, far later than
the dumps: each rank dumps while the job hangs, HANG_S after the scenario's last step, both as
pickle (torch._C._distributed_c10d._dump_fr_trace_file, which writes TORCH_FR_DUMP_TEMP_FILE +
rank) and as JSON (_dump_fr_trace_json), then leaves. A rank killed by the scenario dumps nothing.

The timeout_* scenarios set a 3 s timeout and dump 6 s after the fault, so the waiting ranks
dump after their collective timed out (PyTorch retires it like a finished one). Their committed
fixtures were written without torch by write_timeout_fixtures.py, in the format the dumps of this
script show; running these scenarios regenerates them from real jobs (compare before replacing).

  python make_fixtures.py OUT_DIR [NAME...]  scenarios into OUT_DIR/<scenario>/{pickle,json}
  python make_fixtures.py --rank R SCENARIO  one rank (what the driver starts)
"""

import datetime
import os
import signal
import subprocess
import sys
import threading
import time

WORLD = 4
HANG_S = 4.0
SCENARIOS = {
    "healthy": "every rank runs every step",
    "skip": "rank 1 skips the last world all_reduce",
    "size_mismatch": "rank 2 passes 8 elements where the others pass 4",
    "deadlock": "ranks 0 and 1 take a world and a pair all_reduce in opposite orders",
    "killed": "rank 3 is SIGKILLed before the last all_reduce",
    "unmatched_send": "rank 0 sends to rank 1, which never posts the recv",
    "timeout_w4_r3": "rank 3 never enters world all_reduce #4; the others time out in it",
    "timeout_mesh": "2x2 mesh: rank 3 never enters its tp all_reduce #3",
}
TIMEOUT_S = 3.0


def is_timeout(scenario):
    return scenario.startswith("timeout_")


def dump_later(rank, json_dir, wait_s):
    from torch._C._distributed_c10d import _dump_fr_trace_file, _dump_fr_trace_json

    time.sleep(wait_s)
    _dump_fr_trace_file(rank)
    with open(os.path.join(json_dir, f"rank_{rank}.json"), "wb") as f:
        f.write(_dump_fr_trace_json())
    os._exit(0)


def run_rank(scenario, rank):
    import torch
    import torch.distributed as dist

    timeout = TIMEOUT_S if is_timeout(scenario) else 60
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    if scenario == "timeout_mesh":
        run_mesh(rank)
        return
    pair = dist.new_group([0, 1])
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    wait_s = TIMEOUT_S + HANG_S / 2 if is_timeout(scenario) else HANG_S
    threading.Thread(target=dump_later, args=(rank, os.environ["FIXTURE_JSON_DIR"], wait_s),
                     daemon=True).start()
    try:
        fault(scenario, rank, t, pair)
    except RuntimeError:
        pass  # a peer died: stay until the dump thread ends the process
    time.sleep(3600)


def run_mesh(rank):
    """dp x tp mesh [[0, 1], [2, 3]]: per step a dp all_gather, a tp all_reduce and a world
    all_reduce; in step 3 rank 3 stops after its dp all_gather."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    threading.Thread(target=dump_later,
                     args=(rank, os.environ["FIXTURE_JSON_DIR"], TIMEOUT_S + HANG_S),
                     daemon=True).start()
    t = torch.ones(4)
    try:
        for step in range(3):
            dist.all_gather_into_tensor(torch.empty(8), t, group=dp)
            if step == 2 and rank == 3:
                break
            dist.all_reduce(t, group=tp)
            dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass  # timed out: stay until the dump thread ends the process
    time.sleep(3600)


def fault(scenario, rank, t, pair):
    import torch
    import torch.distributed as dist

    if scenario == "skip" and rank == 1:
        pass
    elif scenario == "size_mismatch":
        dist.all_reduce(torch.ones(8) if rank == 2 else t)
    elif scenario == "deadlock" and rank in (0, 1):
        first, second = (None, pair) if rank == 0 else (pair, None)
        dist.all_reduce(t, group=first)
        dist.all_reduce(t, group=second)
    elif scenario == "timeout_w4_r3" and rank == 3:
        pass  # stays in compute; the others time out in all_reduce #4
    elif scenario == "killed" and rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    elif scenario == "unmatched_send":
        if rank == 0:
            dist.send(t, dst=1)
    else:
        dist.all_reduce(t)


def run_scenario(out, scenario):
    pickles = os.path.join(out, scenario, "pickle")
    jsons = os.path.join(out, scenario, "json")
    os.makedirs(pickles, exist_ok=True)
    os.makedirs(jsons, exist_ok=True)
    port = 29600 + list(SCENARIOS).index(scenario)
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000",
                   TORCH_FR_DUMP_TEMP_FILE=os.path.join(pickles, "rank_"),
                   FIXTURE_JSON_DIR=jsons)
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", str(rank), scenario],
                                      env=env, stderr=subprocess.DEVNULL))
    for p in procs:
        p.wait(timeout=120)
    with open(os.path.join(out, scenario, "README"), "w") as f:
        f.write(f"{scenario}: {SCENARIOS[scenario]} ({WORLD} ranks, Gloo)\n")


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        run_rank(sys.argv[3], int(sys.argv[2]))
    else:
        for name in sys.argv[2:] or SCENARIOS:
            run_scenario(sys.argv[1], name)
            print(f"{name}: {SCENARIOS[name]}")
