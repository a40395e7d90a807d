"""Islands under torchft on emulated hosts (sync.fault_tolerance=torchft): each host its own torchrun job, the
Lighthouse on the switch; a host lost at once (host 0, where the rendezvous of a job of one torchrun would be)
leaves the others stepping, and it rejoins from a peer. And the islands job's exit status."""
import json
from types import SimpleNamespace

import pytest
import torch

from ddp_lab.tools.cluster import emulated, running
from ddp_lab.tools.cluster.islands_job import islands_rc
from ddp_lab.tools.cluster.network import kill_processes
from tests.conftest import tiny_overrides
from tests.helpers.cluster import wait_for
from tests.tools.cluster.conftest import namespaces_or_skip, unique_name

pytest.importorskip("torchft")


def _agent(host: str, rc: int | None, ended_at: float):
    return SimpleNamespace(host=SimpleNamespace(name=host), proc=SimpleNamespace(returncode=rc), ended_at=ended_at)


def test_an_island_too_late_to_rejoin_does_not_fail_the_job():
    # lab-2 lost at 10 s (rc 137), started again, failed at 32 s as the others had ended at 30 and 31 s
    late = [_agent("lab-0", 0, 30), _agent("lab-1", 0, 31), _agent("lab-2", 137, 10), _agent("lab-2", 1, 32)]
    assert islands_rc(late) == (0, ["lab-2"])
    # its last agent failed while the others ran: the job fails with its status
    lost = [_agent("lab-0", 0, 30), _agent("lab-1", 0, 31), _agent("lab-2", 137, 10), _agent("lab-2", 1, 20)]
    assert islands_rc(lost) == (1, [])
    assert islands_rc([_agent("lab-0", 1, 5), _agent("lab-1", 1, 6)]) == (1, [])  # (none completed)
    assert islands_rc([_agent("lab-0", 0, 5), _agent("lab-1", 0, 6)]) == (0, [])


@pytest.fixture
def three_hosts():
    namespaces_or_skip()
    with emulated(3, "50mbit", unique_name()) as cluster:
        yield cluster


@pytest.mark.system
def test_a_lost_host_costs_the_others_a_round_and_rejoins_from_a_peer(three_hosts, tiny_fmnist, tmp_path):
    overrides = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "run")
                 if not o.startswith(("data.batch_size=", "trainer.epochs=", "hydra.run.dir="))]
    command = ["-m", "ddp_lab.train", *overrides, "data.batch_size=48", "trainer.epochs=100", "trainer.max_steps=200",
               "trainer.eval_every_steps=100", "trainer.amp=off", "sync=diloco", "sync.islands=host", "sync.every=4",
               "sync.fault_tolerance=torchft", "sync.max_islands=3", "sync.island_timeout_s=10",
               f"hydra.run.dir={tmp_path}/island${{oc.env:DDP_LAB_ISLAND}}"]
    lost = three_hosts.hosts[0]
    # every island paces its steps (0.1 s at least) so that the lost one is back well before the end
    with running(three_hosts, command, out=None, err=None,
                 env={"DDP_LAB_FAULT": "rank=0,step=1,kind=pace=0.1"}) as job:
        wait_for(lambda: job.output().count("islands present: 3 of the 3 planned") == 3, job, "the islands' quorum")
        wait_for(lambda: "epoch 2/100" in job.output(1), job, "epoch 2 (step 20)")
        assert kill_processes(lost)  # its agent and worker, at once
        wait_for(lambda: job.poll()[0] is not None, job, "the lost host's agent to end")
        wait_for(lambda: "islands present: 2" in job.output(1), job, "a quorum without it")
        job.join(lost.name)  # (as `cluster rejoin HOST`, or `cluster run --rejoin-after-s S`)
        wait_for(lambda: "rejoined from a peer island" in job.output(), job, "the rejoin", timeout=180)
        rc = job.wait(timeout=300)
    out = job.output()
    assert rc == 0, out[-3000:]
    assert f"a torchft Lighthouse on the switch ({three_hosts.switch_address}:" in out  # (no host took it along)
    assert f"{lost.name} joins run" in out
    summaries = [json.loads((tmp_path / f"island{i}" / "summary.json").read_text()) for i in range(3)]
    for s in summaries[1:]:  # the survivors: never restarted, a round dropped at most, 3 -> 2 -> 3 islands
        assert s["restarts_by_rank"] == [0] and s["rounds_dropped"] <= 1 and s["steps"] == 200
        present = [m["islands"] for m in s["membership"]]
        assert present[0] == 3 and 2 in present and present[-1] == 3, s["membership"]
    weights = [torch.load(tmp_path / f"island{i}" / "model.pt") for i in range(3)]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])
