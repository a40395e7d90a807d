"""Two torchrun agents on one host standing in for two nodes (c10d rendezvous on loopback)."""
import uuid

import pytest
import torch

from tests.conftest import free_port, read_summary, tiny_overrides
from tests.distributed.agents import ORDERED, TORCHRUN, agent_command, agent_env, late_close, noise, run_agents

pytestmark = pytest.mark.system


def test_two_agents_share_one_run_directory(tiny_fmnist, tmp_path):
    rdzv_id = f"two-nodes-{uuid.uuid4().hex[:8]}"
    port = free_port()
    # No hydra.run.dir: the run directory comes from --rdzv_id (TORCHELASTIC_RUN_ID), as on a cluster.
    overrides = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "unused") if not o.startswith("hydra.")]
    cmd = agent_command(TORCHRUN, port, rdzv_id, None,
                        ["-m", "ddp_lab.train", *overrides, "trainer.amp=off", "trainer.epochs=1"])
    results = run_agents([(cmd, agent_env())] * 2, tmp_path)
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    outputs = [(out, err) for _, out, err in results]

    summaries = list(tmp_path.glob("outputs/*/summary.json"))
    assert [p.parent.name for p in summaries] == [rdzv_id]  # one run dir, one summary
    run_dir = summaries[0].parent
    s = read_summary(run_dir)
    assert (s["world_size"], s["backend"], s["steps"], s["test_total"]) == (2, "gloo", 8, 203)
    assert (run_dir / "rank0.log").exists() and (run_dir / "rank1.log").exists()
    # each "node" wrote its own rank file into the shared checkpoint
    ckpt = run_dir / "checkpoints" / "step-8"
    assert sorted(p.name for p in ckpt.iterdir()) == ["meta.json", "rank0.pt", "rank1.pt", "state.pt"]
    assert torch.load(run_dir / "model.pt", weights_only=True)["7.weight"].shape == (128, 800)
    # exactly one agent's rank 0 printed the closing line
    assert sum("on 2 x cpu (gloo)" in out for out, _ in outputs) == 1


def test_a_two_node_run_that_succeeded_ends_quietly(tiny_fmnist, tmp_path):
    # Node 1 closes the rendezvous 2 s after node 0, whose agent serves its store: plain torchrun
    # prints a C++ stack on node 1 then (test_torchrun.py); ddp_lab.distributed.torchrun has
    # node 0's agent wait for it, and both end with nothing on stderr but what the run said.
    port, rdzv_id = free_port(), f"quiet-{uuid.uuid4().hex[:8]}"
    entry = ["-m", "ddp_lab.train", *tiny_overrides(tiny_fmnist, tmp_path / "run"), "trainer.amp=off",
             "trainer.epochs=1", "trainer.max_steps=2"]
    late = late_close(tmp_path / "late", 2)
    results = run_agents([(agent_command(ORDERED, port, rdzv_id, True, entry), agent_env()),
                          (agent_command(ORDERED, port, rdzv_id, False, entry), agent_env(late))], tmp_path)
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
        assert noise(err) == [], err[-3000:]
    assert read_summary(tmp_path / "run")["steps"] == 2
