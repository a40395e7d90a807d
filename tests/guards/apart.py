"""Signals that reach the ranks of one job apart, as they reach the nodes of a cluster."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from ddp_lab.cluster.commands import descendants

# synthetic images in 4 steps an epoch of ~3 s each on 2 ranks of 2 cores: a second
# signal up to 3 s after the first still finds the ranks before the agreed step's end
SLOW_STEPS = ["data=synthetic", "data.num_train=32768", "data.num_test=512", "data.batch_size=4096",
              "trainer.epochs=2", "trainer.amp=off", "trainer.compile=false", "trainer.progress=false"]


def rank_pids(root: int) -> dict[int, int]:
    """{rank: pid} of the ddp_lab workers under process `root` (a torchrun agent)."""
    found = {}
    for pid in descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        rank = [e[5:] for e in env if e.startswith(b"RANK=")]
        if rank and b"ddp_lab.train" in cmd:
            found[int(rank[0])] = pid
    return found


def signal_apart(pids: dict[int, int], apart_s: float) -> None:
    """SIGTERM to rank 0, then `apart_s` later to rank 1 (gone by then is fine)."""
    os.kill(pids[0], signal.SIGTERM)
    time.sleep(apart_s)
    try:
        os.kill(pids[1], signal.SIGTERM)
    except ProcessLookupError:
        pass


def saves(run_dir: Path) -> dict[str, str]:
    """{rank: step} of every 'saved checkpoint step-N' line in the ranks' logs."""
    logs = "".join(p.read_text() for p in sorted(run_dir.glob("rank*.log")))
    assert "stopping at once" not in logs, logs[-3000:]
    return {r: s for r, s in re.findall(r"rank (\d): saved checkpoint step-(\d+) [\d.]+ s after", logs)}
