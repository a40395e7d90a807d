"""No hangs: one rank failing ends the whole torchrun job, non-zero, within dist.timeout_s."""
import os
import subprocess
import sys
import time

import pytest

from ddp_lab.config import ConfigError
from ddp_lab.guards.faults import Fault
from tests.conftest import free_port, tiny_overrides


def test_fault_spec_parses_and_fires_on_the_first_attempt_only(monkeypatch):
    monkeypatch.delenv("DDP_LAB_FAULT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert Fault.from_env() is None
    monkeypatch.setenv("DDP_LAB_FAULT", "rank=1,step=5,kind=kill")
    assert Fault.from_env() == Fault(rank=1, step=5, kind="kill")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert Fault.from_env() is None  # the restarted attempt runs clean
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    for bad in ("rank=1,step=5", "rank=one,step=5,kind=raise", "rank=1,step=5,kind=explode"):
        monkeypatch.setenv("DDP_LAB_FAULT", bad)
        with pytest.raises(ConfigError, match="DDP_LAB_FAULT"):
            Fault.from_env()

    for bad in ("rank=0,step=1,kind=slow=1", "rank=0,step=1,kind=pace=0", "rank=0,step=1,kind=pace=x"):
        monkeypatch.setenv("DDP_LAB_FAULT", bad)
        with pytest.raises(ConfigError, match="F: a number above 1; S: seconds above 0"):
            Fault.from_env()


def test_slow_multiplies_a_steps_compute_and_pace_fills_it_up_to_s_seconds(monkeypatch):
    slept = []
    monkeypatch.setattr("ddp_lab.guards.faults.time.sleep", slept.append)
    slow, pace = Fault(rank=1, step=3, kind="slow=3"), Fault(rank=1, step=3, kind="pace=0.5")
    for fault in (slow, pace):
        fault.slow_down(rank=1, step=2, last_compute_s=0.1)  # before its step: nothing
        fault.slow_down(rank=0, step=3, last_compute_s=0.1)  # another rank: nothing
    assert slept == []
    # each step's measured compute includes the sleep added to it; the fault takes that back out
    slow.slow_down(1, 3, last_compute_s=0.1)
    slow.slow_down(1, 4, last_compute_s=0.1 + 0.2)
    pace.slow_down(1, 3, last_compute_s=0.1)
    pace.slow_down(1, 4, last_compute_s=0.1 + 0.4)
    pace.slow_down(1, 5, last_compute_s=0.4 + 0.7)  # one that computed 0.7 s by itself: no sleep
    assert slept == pytest.approx([0.2, 0.2, 0.4, 0.4, 0.0])


@pytest.mark.system
def test_a_rank_that_raises_ends_the_job_within_the_timeout(tiny_fmnist, tmp_path):
    timeout_s = 30  # the failure propagates in seconds; the margin is for a loaded machine
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "-m", "ddp_lab.train",
           *tiny_overrides(tiny_fmnist, run_dir), "trainer.amp=off", "trainer.ckpt_every_steps=2",
           f"dist.timeout_s={timeout_s}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "DDP_LAB_FAULT": "rank=1,step=2,kind=raise"}
    env.pop("RANK", None)
    stderr = open(tmp_path / "stderr.txt", "w+")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    failed_at = None
    try:
        for line in proc.stdout:  # rank 0 prints this right as rank 1 raises after step 2
            if failed_at is None and line.startswith("checkpoint step-2"):
                failed_at = time.monotonic()
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.monotonic()
    stderr.seek(0)
    err = stderr.read()
    assert rc != 0
    assert failed_at is not None, err[-3000:]
    assert ended - failed_at < timeout_s, f"{ended - failed_at:.1f} s after the failure"
    # the failing rank's exception reaches torchrun's output, and torchrun reports the
    # failure (its Root Cause names the failure with the earliest timestamp, in whole
    # seconds with ties to the lower local rank: rank 1, or rank 0 when its own error at
    # the next collective landed in the same second and the same 0.1 s poll)
    assert "DDP_LAB_FAULT: rank 1 fails after step 2" in err
    assert "Root Cause (first observed failure)" in err
    assert not (run_dir / "summary.json").exists()
    print(f"job ended {ended - failed_at:.1f} s after the failure ({ended - start:.1f} s in all)")
