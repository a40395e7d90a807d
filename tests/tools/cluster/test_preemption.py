"""A preemption across two emulated hosts: the signals reach the nodes apart, every rank saves."""
import time

import pytest

from ddp_lab.tools.cluster import running
from tests.guards.apart import SLOW_RANK_1, SLOW_STEPS, rank_pids, saves, signal_apart
from tests.tools.cluster.conftest import namespaces_or_skip

pytestmark = pytest.mark.system


def test_signals_a_second_apart_on_two_hosts_save_on_both(two_hosts, tmp_path):
    namespaces_or_skip()
    run_dir = tmp_path / "run"
    with running(two_hosts, ["-m", "ddp_lab.train", *SLOW_STEPS, f"hydra.run.dir={run_dir}"],
                 env=SLOW_RANK_1, out=None, err=None) as job:
        deadline = time.monotonic() + 120
        pids = {}
        while not (run_dir / "launches.json").exists() or len(pids) < 2:
            assert None in job.poll() and time.monotonic() < deadline, job.output()[-3000:]
            time.sleep(0.1)
            pids = {r: p for a in job.agents for r, p in rank_pids(a.proc.pid).items()}
        signal_apart(pids, run_dir, 1.0)
        job.wait(timeout=120)
    saved = saves(run_dir)
    assert sorted(saved) == ["0", "1"] and saved["0"] == saved["1"], job.output()[-3000:]
    assert (run_dir / "checkpoints" / f"step-{saved['0']}" / "meta.json").exists()
