"""Save and resume-check time of a checkpoint of the 403M GPT's size at 8 ranks (fsdp: each rank's file holds
its eighth of the fp32 weights and AdamW's two moments, 576 MiB), with whichever ddp_lab is on PYTHONPATH:
before (rank 0 hashes every file after the save and before a resume) or after (each rank hashes its own).

    torchrun --nproc_per_node=8 bench.py --root /tmp/ckpt-bench --mib 576
"""
import argparse
import inspect
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_lab import checkpoint
from ddp_lab.distributed import DistEnv

parser = argparse.ArgumentParser()
parser.add_argument("--root", type=Path, required=True)
parser.add_argument("--mib", type=int, default=576)
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
env = DistEnv(rank, world, rank, torch.device("cpu"), "gloo")
g = torch.Generator().manual_seed(rank)
own = {"weights": torch.rand(args.mib * 2**20 // 4, generator=g), "rng": checkpoint.rng_state(env.device)}
shared = {"model": {"buffer": torch.zeros(16)}} if rank == 0 else None
meta = {"config_hash": "bench", "config": {}} if rank == 0 else None
new = "verify" in inspect.signature(checkpoint.problem).parameters

dist.barrier()
t0 = time.perf_counter()
path = checkpoint.save(args.root, 1, env, own, shared, meta, keep=1)
dist.barrier()
saved = time.perf_counter() - t0

del own
dist.barrier()
t0 = time.perf_counter()
if new:  # rank 0 picks by sizes; every rank checks what it reads whole, at once
    found = [str(checkpoint.newest(args.root, verify=())) if rank == 0 else None]
    dist.broadcast_object_list(found, src=0)
    mine = [checkpoint.rank_file(rank), *([checkpoint.STATE] if rank == 0 else [])]
    assert checkpoint.problem(Path(found[0]), verify=mine) is None
else:  # rank 0 checks every file; the others wait
    found = [str(checkpoint.newest(args.root)) if rank == 0 else None]
    dist.broadcast_object_list(found, src=0)
dist.barrier()
checked = time.perf_counter() - t0
if rank == 0:
    print(f"{'after' if new else 'before'} ranks={world} mib_per_rank={args.mib} save_s={saved:.3f} "
          f"resume_check_s={checked:.3f}", flush=True)
dist.destroy_process_group()
