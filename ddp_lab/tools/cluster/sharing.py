"""How the emulated hosts share this one machine: its cores and its GPUs.

Only the network is emulated; every host's workers run on the same cores and
see the same GPUs, and `cluster run` says how in one line before the job.

Threads: torchrun sets OMP_NUM_THREADS=1 only when it starts 2+ workers on
its node, so 1 rank per host would run one thread per core in every rank, 2
hosts x 2 threads on 2 cores: slower than 1 thread each, and the threads'
differing summation order changes the weights. So each worker gets
cores // workers threads (at least 1), unless OMP_NUM_THREADS is set already.

GPUs: each host's LOCAL_RANK 0 takes cuda:0, so with `dist.device=auto` every
host's first rank lands on the same GPU, and NCCL, seeing different
hostnames, carries the all-reduce between them over its sockets on the
emulated links, well below what gloo on the CPU gets from them
(docs/communication.md, "Across a network").
"""
from __future__ import annotations

from pathlib import Path

# Every worker's environment says how many ranks all the hosts run on this
# machine's cores (the MFU's peak and opt-in machine tuning count them).
from ddp_lab.distributed import RANKS_ON_MACHINE_ENV, usable_cores

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver has


def thread_share(workers: int, cores: int | None = None) -> int:
    """Torch threads per worker so that `workers` processes fill the cores without oversubscribing."""
    return max(1, (cores or usable_cores()) // workers)


def visible_gpus(env: dict) -> int:
    """The NVIDIA GPUs a worker with this environment sees (read without importing torch)."""
    if "CUDA_VISIBLE_DEVICES" in env:  # CUDA reads it up to the first invalid id ("" or "-1")
        ids = [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",")]
        return next((i for i, d in enumerate(ids) if not d or d.startswith("-")), len(ids))
    return len(list(NVIDIA_GPUS.iterdir())) if NVIDIA_GPUS.is_dir() else 0


def share(env: dict, hosts: int, nproc_per_host: int) -> str:
    """Set the workers' share of the machine in `env`; one line saying how it is shared."""
    workers, cores = hosts * nproc_per_host, usable_cores()
    env[RANKS_ON_MACHINE_ENV] = str(workers)
    shape = f"{hosts} host(s) x {nproc_per_host} rank(s) share {cores} core(s)"
    if "OMP_NUM_THREADS" in env:
        note = f"{shape}: OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per worker, as set"
    else:
        env["OMP_NUM_THREADS"] = str(thread_share(workers, cores))
        note = (f"{shape}: OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per worker, a fair share "
                "(set OMP_NUM_THREADS to choose)")
    if workers > cores:
        note += "; more workers than cores, so the hosts also compete for the CPU"
    gpus = visible_gpus(env)
    if gpus and hosts > 1:
        note += (f"; every host sees the same {gpus} GPU(s), so ranks on cuda share them and NCCL "
                 "crosses the emulated links (dist.device=cpu keeps the ranks on the CPU)")
    return note
