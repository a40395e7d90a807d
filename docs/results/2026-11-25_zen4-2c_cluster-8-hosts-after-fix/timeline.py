# Ran with the code of commit 58386eafa; it imports ddp_lab internals that have moved or gone since,
# so it runs at that commit only: git worktree add /tmp/ddp_lab-58386eafa 58386eafa
"""Timeline of halving-doubling's steps as shipped (each step's receive posted just before
its send), every rank on one clock: 40 calls of 4 MiB (a barrier every 4), the
first 8 left out; writes $OUT/trace-RANK.json for timeline_summary.py."""
import os, time, json
import torch, torch.distributed as dist
from omegaconf import OmegaConf
from ddp_lab import tuning
from ddp_lab.collectives.halving_doubling import _prepare_halving_doubling
from ddp_lab.collectives.p2p import comm_of, wait_all
from ddp_lab.collectives.pairwise import Step

env = tuning.start(OmegaConf.create({"backend": "gloo", "device": "cpu", "timeout_s": 300, "comm_threads": "auto"}))
rank, n = dist.get_rank(), dist.get_world_size()
numel = int(os.environ.get("BYTES", 4 << 20)) // 4
x = torch.ones(numel)
plan = tuning.plan_for(env)
comm = comm_of(None, False)
steps, early = _prepare_halving_doubling(x, comm, plan)
T = time.perf_counter_ns

def run(log):
    sends = []
    for st in steps:
        t0 = T()
        w = comm.irecv(st.recv, st.peer, st.tag) if st.recv is not None else None
        if st.send is not None:
            sends.append(comm.isend(st.send, st.peer, st.tag))
        t1 = T()
        if w is not None:
            w.wait()
        t2 = T()
        if st.add_into is not None:
            st.add_into.add_(st.recv)
        t3 = T()
        log.append((st.peer, st.tag, t0, t1, t2, t3))
    wait_all(sends)
    log.append(("end", 0, T(), 0, 0, 0))

out = []
with tuning.at_comm_priority(env.comm_threads == "realtime"):
    for it in range(40):
        if it % 4 == 0:
            dist.barrier()
        log = []
        run(log)
        if it >= 8:
            out.append(log)
path = os.environ["OUT"] + f"/trace-{rank}.json"
json.dump(out, open(path, "w"))
dist.destroy_process_group()
