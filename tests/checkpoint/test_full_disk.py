"""A disk that fills up mid-run, for real: a small tmpfs as the run directory (needs root)."""
import pytest

from ddp_lab import checkpoint
from tests.conftest import run_module, tiny_overrides


@pytest.fixture
def small_disk(mount_tmpfs):
    """A 2 MiB disk: room for LeNet's first checkpoint (about 1 MiB) and the logs, not two."""
    return mount_tmpfs("size=2m")


@pytest.mark.system
def test_a_full_disk_stops_every_rank_in_one_line_and_keeps_the_last_checkpoint(
        small_disk, tiny_fmnist, tmp_path):
    run = small_disk / "run"
    args = tiny_overrides(tiny_fmnist, run, cache=tmp_path / "cache") + [
        "trainer.ckpt_every_steps=2", "trainer.keep_ckpts=5", "dist.timeout_s=60"]
    proc = run_module("ddp_lab.train", args, nproc=2)
    assert proc.returncode != 0
    errors = sorted(ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error:"))
    assert len(errors) == 2, proc.stderr[-3000:]
    step = errors[0].split("checkpoint step-")[1].split()[0]
    expected = f"no space left on {run}/checkpoints while writing checkpoint step-{step} (it needs about"
    assert errors[0].startswith(f"ddp_lab: error: {expected}")  # rank 0's own
    assert errors[1].startswith(f"ddp_lab: error: rank 0: {expected}")  # what rank 1 was told
    saved = checkpoint.step_dirs(run / "checkpoints")
    assert saved and all(s < int(step) for s, _ in saved)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")] == []
    assert checkpoint.problem(saved[-1][1]) is None  # the previous checkpoint loads
    assert not (run / "model.pt").exists() and not (run / "summary.json").exists()
