"""A host cut off from the network ends, with its agent, instead of waiting for its cable."""
import re
import time

import pytest

from ddp_lab.tools.cluster import emulated, running
from ddp_lab.tools.cluster.network import set_link
from tests.conftest import read_summary, tiny_overrides
from tests.helpers.cluster import wait_for
from tests.tools.cluster.conftest import namespaces_or_skip, unique_name

pytestmark = pytest.mark.system
TIMEOUT_S = 10  # dist.timeout_s


def test_a_cut_off_host_ends_with_its_agent_and_the_other_goes_on(tiny_fmnist, tmp_path):
    namespaces_or_skip()
    run_dir = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_fmnist, run_dir)
                 if not o.startswith(("data.batch_size=", "trainer.epochs="))]
    command = ["-m", "ddp_lab.train", *overrides, "data.batch_size=48", "trainer.epochs=8",
               "trainer.ckpt_every_steps=4", "trainer.compile=false", "trainer.amp=off",
               f"dist.timeout_s={TIMEOUT_S}", "optim.lr=0.05"]
    with emulated(2, "50mbit", unique_name()) as cluster:
        cut = cluster.hosts[1]
        with running(cluster, command, max_restarts=2, min_hosts=1,
                     rdzv_conf={"last_call_timeout": 2}, out=None, err=None) as job:
            wait_for(lambda: list(run_dir.glob("checkpoints/step-*")), job, "checkpoint")
            set_link(cluster, cut.name, up=False)
            cut_at = time.monotonic()
            wait_for(lambda: job.poll()[1] is not None, job, "the cut-off host's agent to end",
                     timeout=TIMEOUT_S + 60)
            ended_after = job.agents[1].ended_at - cut_at
            rc = job.wait(timeout=300)
            set_link(cluster, cut.name, up=True)
    out = job.output(1)
    # the rank's line, and its agent gone with it (SIGKILL), well before TCP itself gives up
    assert re.search(r"ddp_lab: error: rank 1 (lost its peers|has waited \d+ s in .* and lost its "
                     r"peers).*its torchrun agent \(process \d+\) cannot reach its rendezvous at \S+ either: "
                     r"ended it", out), out[-3000:]
    assert job.agents[1].proc.returncode == -9 and ended_after < TIMEOUT_S + 30, (ended_after, out[-2000:])
    assert rc == 0, job.output()[-3000:]  # the other host finished the run alone
    s = read_summary(run_dir)
    assert [size for _, size in s["world_sizes"]] == [2, 1], s["world_sizes"]
