"""Signals that reach the ranks of one job apart, as they reach the nodes of a cluster.

Rank 0 gets SIGTERM; rank 1 reads the step to stop after from the store, and only
then, `apart_s` later, gets its own: the order of a multi-node preemption whose
signals reach the nodes apart. Rank 1 is slowed (DDP_LAB_FAULT slow) so that
the agreed step lasts longer than the gap, on any CPU.
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from ddp_lab.tools.cluster.commands import descendants

# the save's deadline is past the slow step: on a loaded 2-core machine the first step computed for over
# 1 s, and rank 1's sleep in the agreed step outlasted the default 20 s (rank 0 gave up, no save)
SLOW_STEPS = ["data=synthetic", "data.num_train=65536", "data.num_test=512", "data.batch_size=2048",
              "trainer.epochs=1", "trainer.amp=off", "trainer.compile=false", "trainer.progress=false",
              "trainer.preempt_save_s=90"]
# each step from the second on sleeps 19 times its compute: seconds, also on a fast CPU
SLOW_RANK_1 = {"DDP_LAB_FAULT": "rank=1,step=2,kind=slow=20"}
LEARNED = "rank 1: SIGTERM to rank 0; saving a checkpoint after step"


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


def signal_apart(pids: dict[int, int], run_dir: Path, apart_s: float, timeout: float = 60) -> None:
    """SIGTERM to rank 0; once rank 1 has read the agreed step, `apart_s` later, to rank 1."""
    os.kill(pids[0], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    log = run_dir / "rank1.log"
    while not (log.exists() and LEARNED in log.read_text()):
        assert time.monotonic() < deadline, f"rank 1 never read the step: {log.read_text()[-2000:]}"
        time.sleep(0.05)
    time.sleep(apart_s)
    os.kill(pids[1], signal.SIGTERM)


def saves(run_dir: Path) -> dict[str, str]:
    """{rank: step} of every 'saved checkpoint step-N' line in the ranks' logs; rank 1's own
    signal said to come after the agreement, and no rank stopped without a save."""
    logs = "".join(p.read_text() for p in sorted(run_dir.glob("rank*.log")))
    assert "stopping at once" not in logs.replace("a second SIGTERM stops at once", ""), logs[-3000:]
    assert re.search(r"rank 1 got SIGTERM at step \d+: saving the checkpoint after step \d+ the ranks "
                     r"agreed on \(SIGTERM to rank 0", logs), logs[-3000:]
    return {r: s for r, s in re.findall(r"rank (\d): saved checkpoint step-(\d+) [\d.]+ s after", logs)}
