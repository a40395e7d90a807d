"""Two torchrun agents on one host standing in for two nodes (c10d rendezvous on loopback)."""
import os
import subprocess
import sys
import uuid

import pytest
import torch

from tests.conftest import free_port, read_summary, tiny_overrides

pytestmark = pytest.mark.system


def test_two_agents_share_one_run_directory(tiny_fmnist, tmp_path):
    rdzv_id = f"two-nodes-{uuid.uuid4().hex[:8]}"
    port = free_port()
    # No hydra.run.dir: the run directory comes from --rdzv_id (TORCHELASTIC_RUN_ID), as on a cluster.
    overrides = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "unused") if not o.startswith("hydra.")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rdzv_id}",
           "-m", "ddp_lab.train", *overrides, "trainer.amp=off", "trainer.epochs=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)
    agents = [subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for _ in range(2)]
    try:
        outputs = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    for a, (_, err) in zip(agents, outputs):
        assert a.returncode == 0, err[-3000:]

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
