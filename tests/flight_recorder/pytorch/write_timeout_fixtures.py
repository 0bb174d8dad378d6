"""Writes the timed-out fixtures under fixtures/timeout_* without torch (CI has none).

They mirror, field for field, what PyTorch 2.15's recorder writes for a rank that dumped after its
collective timed out (the committed dumps of make_fixtures.py show the format; its `timeout_*`
scenarios make the same jobs with torch, to regenerate from real runs):

- Gloo: every entry has state "scheduled" and no discovered times (Gloo gives the recorder no
  events); the worker retires the entry when the work ends, with or without an error, so the
  timed-out entry reads `"retired": true` like a finished one, and pg_status counts it as the
  last completed collective. pg_id is the process's own count of the groups it built; the name
  in process_group[0] is the one every member shares. pg_config holds one entry keyed "" per
  rank: the ranks of the last group the rank built.
- `stamped=True`: a recorder that stamps retirement (retire_completed: state "completed",
  started = completed = the moment the worker gave up).
- NCCL (p2p scenarios): sends and receives are named "nccl:send 0->1" / "nccl:recv 1<-0" (group
  ranks); an op the watchdog timed out has its start event discovered, no completion, and is
  retired once its work holds the exception.

JSON is written as _dump_fr_trace_json writes it (sorted keys, no spaces, pg_status values as
text, None as 0); the pickle as torch's own pickler writes it (protocol 2, every string put in
the memo once and fetched with BINGET after, lists and dicts as EMPTY + MARK + APPENDS/SETITEMS).

  python3 write_timeout_fixtures.py [OUT_DIR]   (default: fixtures/ beside this script)
"""

import json
import os
import struct
import sys

BASE_NS = 1795495100000000000


class TorchPickler:
    def __init__(self):
        self.out = bytearray(b"\x80\x02")
        self.memo = {}

    def put(self, v):
        if v is None:
            self.out += b"N"
        elif v is True:
            self.out += b"\x88"
        elif v is False:
            self.out += b"\x89"
        elif isinstance(v, int):
            if 0 <= v < 256:
                self.out += b"K" + bytes([v])
            elif 0 <= v < 65536:
                self.out += b"M" + struct.pack("<H", v)
            elif -2**31 <= v < 2**31:
                self.out += b"J" + struct.pack("<i", v)
            else:
                raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                self.out += b"\x8a" + bytes([len(raw)]) + raw
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            if v in self.memo:
                self.out += b"h" + bytes([self.memo[v]])
            else:
                raw = v.encode()
                self.out += b"X" + struct.pack("<I", len(raw)) + raw
                self.memo[v] = len(self.memo)
                assert self.memo[v] < 255, "more strings than BINPUT/BINGET address"
                self.out += b"q" + bytes([self.memo[v]])
        elif isinstance(v, tuple):
            assert len(v) == 2
            for x in v:
                self.put(x)
            self.out += b"\x86"
        elif isinstance(v, list):
            self.out += b"]("
            for x in v:
                self.put(x)
            self.out += b"e"
        elif isinstance(v, dict):
            self.out += b"}("
            for k, x in v.items():
                self.put(k)
                self.put(x)
            self.out += b"u"
        else:
            raise TypeError(v)

    def dump(self, v):
        self.put(v)
        self.out += b"q" + bytes([len(self.memo)]) + b"."
        return bytes(self.out)


class Rank:
    def __init__(self, rank, program, continues):
        self.rank = rank
        self.program = program  # [(group name, op, numel)]
        self.at = 0
        self.continues = continues
        self.clock = BASE_NS + rank * 211_000
        self.entries = []
        self.seq = {}  # group name -> collective seq issued
        self.p2p = {}  # group name -> p2p seq issued
        self.local_pg = {}  # group name -> pg_id
        self.last_built = None


def simulate(world, groups, programs, timeout_ms, continues=(), nccl=False, stamped=False):
    """groups: {name: (desc, [ranks])} in creation order; programs: {rank: [(group, op, numel)]}
    where op is a collective name or ("send"|"recv", peer global rank). Every rank builds the
    groups it belongs to, in order; a call blocks until every member (both ends) makes it; when no
    call can complete, every blocked call times out, and ranks in `continues` go on after it."""
    ranks = [Rank(r, programs.get(r, []), r in continues) for r in range(world)]
    for r in ranks:
        for name, (_, members) in groups.items():
            if r.rank in members:
                r.local_pg[name] = len(r.local_pg)
                r.last_built = members

    def key(r):  # what the rank's current call must meet
        if r.at >= len(r.program):
            return None
        g, op, _ = r.program[r.at]
        if isinstance(op, tuple):
            return (g, op[0], op[1])
        return (g, op, r.seq.get(g, 0) + 1)

    def issue(r):
        g, op, numel = r.program[r.at]
        desc, members = groups[g]
        prefix = "nccl" if nccl else "gloo"
        if isinstance(op, tuple):
            r.p2p[g] = r.p2p.get(g, 0) + 1
            me, peer = members.index(r.rank), members.index(op[1])
            name = (f"{prefix}:send {me}->{peer}" if op[0] == "send"
                    else f"{prefix}:recv {me}<-{peer}")
            is_p2p = True
        else:
            r.seq[g] = r.seq.get(g, 0) + 1
            name = f"{prefix}:{op}"
            is_p2p = False
        e = {
            "record_id": len(r.entries), "pg_id": r.local_pg[g], "process_group": (g, desc),
            "thread_name": "python", "thread_id": str(139640136846208 + r.rank * 4096),
            "collective_seq_id": r.seq.get(g, 0), "p2p_seq_id": r.p2p.get(g, 0),
            "op_id": r.seq.get(g, 0) + r.p2p.get(g, 0), "profiling_name": name,
            "time_created_ns": r.clock,
            "input_sizes": [[numel]], "input_dtypes": ["Float"],
            "output_sizes": [[numel]], "output_dtypes": ["Float"],
            "state": "scheduled", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": False, "timeout_ms": timeout_ms,
            "is_p2p": is_p2p,
        }
        r.entries.append(e)
        return e

    def finish(r, timed_out):
        e = r.entries[-1]
        r.clock += timeout_ms * 1_000_000 if timed_out else 1_300_000 + r.rank * 7_000
        e["retired"] = True
        if nccl:
            e["state"] = "started" if timed_out else "completed"
            e["time_discovered_started_ns"] = e["time_created_ns"] + 40_000
            if not timed_out:
                e["time_discovered_completed_ns"] = r.clock
        elif stamped:
            e["state"] = "completed"
            e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = r.clock
        r.at += 1

    pending = {}
    while True:
        for r in ranks:  # every rank issues its current call (once)
            if r.at < len(r.program) and pending.get(r.rank) != r.at:
                issue(r)
                pending[r.rank] = r.at
        ready = []
        for r in ranks:
            k = key(r)
            if k is None:
                continue
            g, op, x = k
            if op in ("send", "recv"):
                peer = ranks[x]
                want = (g, "recv" if op == "send" else "send", r.rank)
                if key(peer) == want:
                    ready.append(r)
            elif all(key(ranks[m]) == k for m in groups[g][1]):
                ready.append(r)
        if ready:
            for r in ready:
                finish(r, timed_out=False)
            continue
        blocked = [r for r in ranks if key(r) is not None]
        if not blocked:
            break
        for r in blocked:  # nothing can move: the watchdogs fire
            finish(r, timed_out=True)
            if not r.continues:
                r.at = len(r.program)
        if not any(r.at < len(r.program) for r in ranks):
            break
    return ranks


def write(out, name, readme, world, groups, programs, timeout_ms=5000, **kw):
    ranks = simulate(world, groups, programs, timeout_ms, **kw)
    nccl = kw.get("nccl", False)
    for fmt in ("json", "pickle"):
        os.makedirs(os.path.join(out, name, fmt), exist_ok=True)
    for r in ranks:
        status = {}
        for g, pg in r.local_pg.items():
            es = [e for e in r.entries if e["process_group"][0] == g and not e["is_p2p"]]
            done = [e["collective_seq_id"] for e in es if e["retired"]]
            status[str(pg)] = {
                "last_enqueued_collective": es[-1]["collective_seq_id"] if es else -1,
                "last_started_collective": -1,
                "last_completed_collective": max(done) if done else -1,
            }
        if nccl:
            config = {g: {"name": g, "desc": d, "ranks": str(m)}
                      for g, (d, m) in groups.items() if r.rank in m}
        else:
            config = {"": {"name": "", "desc": "", "ranks": str(r.last_built)}}
        top = {"version": "2.10", "pg_config": config,
               "comm_lib_version": "2.21.5" if nccl else "", "pg_status": status,
               "entries": r.entries}
        with open(os.path.join(out, name, "pickle", f"rank_{r.rank}"), "wb") as f:
            f.write(TorchPickler().dump(top))
        as_json = dict(top, nccl_comm_state={}, entries=[
            {k: (0 if v is None else list(v) if isinstance(v, tuple) else v)
             for k, v in e.items()} for e in r.entries],
            pg_status={p: {k: str(v) for k, v in s.items()} for p, s in status.items()})
        with open(os.path.join(out, name, "json", f"rank_{r.rank}.json"), "w") as f:
            f.write(json.dumps(as_json, sort_keys=True, separators=(",", ":")))
    with open(os.path.join(out, name, "README"), "w") as f:
        f.write(f"{name}: {readme} ({world} ranks, {'NCCL' if nccl else 'Gloo'}; "
                f"written by write_timeout_fixtures.py in the recorder's format)\n")


def world_steps(world, steps, skip_rank=None, skip_at=None):
    """`steps` world all_reduces on every rank; `skip_rank` stops (stays in compute) before #skip_at."""
    programs = {}
    for r in range(world):
        n = steps if r != skip_rank else skip_at - 1
        programs[r] = [("0", "all_reduce", 4)] * n
    return programs


def main(out):
    world_only = lambda w: {"0": ("default_pg", list(range(w)))}
    # One rank never enters the last world all_reduce; the others time out in it (retired).
    for world, culprit in ((2, 1), (3, 0), (4, 3), (8, 5)):
        write(out, f"timeout_w{world}_r{culprit}",
              f"rank {culprit} never enters world all_reduce #4; the others time out in it and "
              "dump after the timeout", world, world_only(world),
              world_steps(world, 4, culprit, 4))
    # The recorder that stamps retirement: the timed-out entry reads state "completed".
    write(out, "timeout_stamped",
          "rank 2 never enters world all_reduce #4; the others time out in it; retirement stamped",
          4, world_only(4), world_steps(4, 4, 2, 4), stamped=True)
    # 2x2 mesh (dp x tp, mesh [[0, 1], [2, 3]]): rank 3 never enters its tp all_reduce #3; rank 2
    # times out in it; ranks 0 and 1 finished their tp group's #3 and wait in world #4 (rank 2
    # never gets there, rank 3 never does).
    mesh = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("mesh_dp", [0, 2]), "2": ("mesh_dp", [1, 3]),
            "3": ("mesh_tp", [0, 1]), "4": ("mesh_tp", [2, 3])}
    dp = {0: "1", 2: "1", 1: "2", 3: "2"}
    tp = {0: "3", 1: "3", 2: "4", 3: "4"}
    step = lambda r: [(dp[r], "all_gather", 8), (tp[r], "all_reduce", 4), ("0", "all_reduce", 1)]
    programs = {r: step(r) * 3 for r in range(4)}
    programs[3] = step(3) * 2 + [(dp[3], "all_gather", 8)]
    write(out, "timeout_mesh", "2x2 mesh: rank 3 never enters tp all_reduce #3; rank 2 times out "
          "in it, ranks 0,1 in world all_reduce #3", 4, mesh, programs)
    # Ranks catch the timeout and go on: after world #3 times out (rank 1 never enters it),
    # ranks 0,2,3 run a dp and a tp all_reduce that complete where every member entered them.
    programs = {r: step(r) * 3 for r in range(4)}
    programs[1] = step(1) * 2 + [(dp[1], "all_gather", 8), (tp[1], "all_reduce", 4)]
    for r in (0, 2, 3):
        programs[r] = programs[r] + [(tp[r], "all_reduce", 4)]
    write(out, "timeout_continued", "2x2 mesh: rank 1 never enters world all_reduce #3; ranks "
          "0,2,3 time out in it, catch the error and run on in their groups", 4, mesh, programs,
          continues=(0, 2, 3))
    # Every rank really finished: stays healthy (Gloo and stamped).
    write(out, "timeout_healthy", "every rank runs every step (timeouts set, none fires)", 8,
          world_only(8), world_steps(8, 4))
    write(out, "timeout_healthy_mesh", "2x2 mesh, every rank runs every step", 4, mesh,
          {r: step(r) * 3 for r in range(4)}, stamped=True)
    # Point to point (NCCL names the peers): rank 0 sends to rank 1, which never posts the recv;
    # the send times out and is retired.
    p2p = {0: [("0", "all_reduce", 4), ("0", ("send", 1), 4), ("0", ("send", 1), 4)],
           1: [("0", "all_reduce", 4), ("0", ("recv", 0), 4)],
           2: [("0", "all_reduce", 4)]}
    write(out, "timeout_p2p", "rank 0's second send to rank 1 times out: rank 1 never posts the "
          "recv", 3, world_only(3), p2p, nccl=True)
    p2p = {0: [("0", "all_reduce", 4), ("0", ("send", 1), 4)],
           1: [("0", "all_reduce", 4), ("0", ("recv", 0), 4)]}
    write(out, "timeout_p2p_healthy", "rank 0 sends to rank 1, which receives", 2,
          world_only(2), p2p, nccl=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
