"""Launching `ddp_lab.train` from a benchmark: one run under torchrun on this machine,
or across the emulated hosts of ddp_lab.tools.cluster, and the summary.json it wrote.
Used by bench.scaling, bench.time_to_accuracy and bench.fault_drill; torch is not
imported here (the runs are subprocesses)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HYDRA_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn")  # flags that take a value


def flags_first(args: list[str]) -> list[str]:
    """Hydra's flags (--config-dir DIR: a user's own model and data) before the overrides,
    where its command line parser wants them."""
    flags, rest, i = [], [], 0
    while i < len(args):
        if args[i] in HYDRA_FLAGS and i + 1 < len(args):
            flags += args[i:i + 2]
            i += 2
        else:
            (flags if args[i].startswith(tuple(f + "=" for f in HYDRA_FLAGS)) else rest).append(args[i])
            i += 1
    return flags + rest


def run_trainer(world: int, overrides: list[str], run_dir: Path, timeout: float, cluster=None,
                nproc_per_host: int = 1) -> dict:
    """One torchrun launch of the trainer (on `world` hosts of `cluster`, if given, `nproc_per_host` ranks
    each); its summary.json."""
    overrides = flags_first(overrides)
    if cluster is not None:
        from ddp_lab.tools.cluster import running  # torch: only for runs across emulated hosts

        command = ["-m", "ddp_lab.train", *overrides, f"hydra.run.dir={run_dir}", "trainer.progress=false"]
        with running(cluster, command, hosts=world, nproc_per_host=nproc_per_host, out=None, err=None) as job:
            rc = job.wait(timeout=timeout)
        if rc != 0:
            raise RuntimeError(f"run on {world} host(s) failed (exit {rc}):\n{job.output()[-3000:]}")
        return json.loads((run_dir / "summary.json").read_text())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={world}",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
           "-m", "ddp_lab.train", *overrides, f"hydra.run.dir={run_dir}", "trainer.progress=false"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"run with {world} rank(s) failed (exit {proc.returncode}):\n"
                           f"{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())
