"""Several torchrun agents on this host, each its own "node", meeting at a c10d rendezvous on
loopback: the commands, a late-closing agent, and running them to the end."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# torchrun as users run it, and ddp_lab's (ddp_lab.distributed.torchrun: the agents leave in order)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ORDERED = [sys.executable, "-m", "ddp_lab.distributed.torchrun"]

# What a C++ warning's stack, a Python traceback or torch's failed shutdown would leave on stderr
NOISE = ("RendezvousConnectionError", "Traceback", "frame #", "failed to shutdown", "Exception raised from")

# Imported at start-up by the processes of an agent whose PYTHONPATH holds it: that agent closes
# the rendezvous `seconds` late, as one across a slow link or on a loaded machine does.
LATE_CLOSE = '''
import time
try:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr
    _shutdown = _dr.DynamicRendezvousHandler.shutdown
    def _late(self):
        time.sleep({seconds})
        return _shutdown(self)
    _dr.DynamicRendezvousHandler.shutdown = _late
except ImportError:
    pass
'''


def late_close(folder: Path, seconds: float) -> str:
    """A PYTHONPATH entry that makes an agent close its rendezvous `seconds` late."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(LATE_CLOSE.format(seconds=seconds))
    return str(folder)


def agent_command(torchrun: list[str], port: int, rdzv_id: str, serves: bool | None, entry: list[str],
                  nodes: int = 2) -> list[str]:
    """One agent of a `nodes`-node job; serves: whether it serves the rendezvous store (None:
    torch decides, the first on this host does)."""
    conf = [] if serves is None else [f"--rdzv-conf=is_host={str(serves).lower()}"]
    return [*torchrun, f"--nnodes={nodes}", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rdzv_id}", *conf, *entry]


def agent_env(pythonpath: str | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    return env


def run_agents(commands: list[tuple[list[str], dict]], cwd: Path, timeout: float = 240) -> list[tuple[int, str, str]]:
    """Start every (command, environment) at once; each agent's (exit status, stdout, stderr)."""
    agents = [subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for cmd, env in commands]
    try:
        outputs = [a.communicate(timeout=timeout) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    return [(a.returncode, out, err) for a, (out, err) in zip(agents, outputs)]


def noise(stderr: str) -> list[str]:
    """The lines of `stderr` that a quiet end has none of."""
    return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]
