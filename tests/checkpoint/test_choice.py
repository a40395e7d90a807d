"""Which checkpoint a launch continues from, and when a run directory is left alone."""
import pytest

from ddp_lab import checkpoint
from ddp_lab.config import ConfigError
from ddp_lab.guards.rundir import launch_identity, record_launch
from tests.checkpoint.conftest import ALONE, save_small

ELSEWHERE = "in another directory (hydra.run.dir=... or DDP_LAB_RUN_ID=<name>)"


def _finished_run_without_checkpoints(run):
    """What a run with trainer.keep_ckpts=0 (or every checkpoint damaged) leaves."""
    (run / "tb").mkdir(parents=True)
    (run / "tb" / "events.out.tfevents.1.host").write_bytes(b"events")
    (run / "model.pt").write_bytes(b"weights")
    (run / "summary.json").write_text("{}")


def test_a_fresh_directory_starts_from_scratch(tmp_path):
    for resume in ("none", "auto"):
        assert checkpoint.pick(resume, tmp_path / "run", owned=False) is None


def test_auto_continues_the_newest_intact_checkpoint(tmp_path):
    run = tmp_path / "run"
    save_small(run / "checkpoints", 2)
    newest, _, _ = save_small(run / "checkpoints", 5)
    assert checkpoint.pick("auto", run, owned=False) == newest
    (newest / "state.pt").write_bytes(b"damaged")
    assert checkpoint.pick("auto", run, owned=False) == run / "checkpoints" / "step-2"


def test_a_new_run_never_writes_over_checkpoints(tmp_path):
    run = tmp_path / "run"
    save_small(run / "checkpoints", 2)
    save_small(run / "checkpoints", 5)
    with pytest.raises(ConfigError) as e:
        checkpoint.pick("none", run, owned=False)
    assert str(e.value) == (
        f"{run} already holds an earlier run (checkpoints up to step-5), which a new run there "
        f"would overwrite. Continue it with trainer.resume=auto, or start afresh {ELSEWHERE}")


@pytest.mark.parametrize("resume", ["none", "auto"])
def test_a_finished_run_without_checkpoints_is_never_written_over(tmp_path, resume):
    run = tmp_path / "run"
    _finished_run_without_checkpoints(run)
    with pytest.raises(ConfigError) as e:
        checkpoint.pick(resume, run, owned=False)
    held = f"{run} already holds an earlier run (model.pt, summary.json, TensorBoard events in tb/)"
    if resume == "auto":
        assert str(e.value) == (f"trainer.resume=auto: {held} but no intact checkpoint to "
                                f"continue from, and will not overwrite it; start afresh {ELSEWHERE}")
    else:
        assert str(e.value) == f"{held}, which a new run there would overwrite. Start afresh {ELSEWHERE}"


def test_every_checkpoint_damaged_counts_as_nothing_to_continue(tmp_path):
    run = tmp_path / "run"
    bad, _, _ = save_small(run / "checkpoints", 3)
    (bad / "meta.json").unlink()
    with pytest.raises(ConfigError, match=r"earlier run \(checkpoints up to step-3\) but no intact"):
        checkpoint.pick("auto", run, owned=False)


def test_events_alone_are_an_earlier_run(tmp_path):
    run = tmp_path / "run"
    (run / "tb" / "sub").mkdir(parents=True)
    (run / "tb" / "sub" / "events.out.tfevents.1.host").write_bytes(b"events")
    with pytest.raises(ConfigError, match=r"\(TensorBoard events in tb/\)"):
        checkpoint.pick("none", run, owned=False)


@pytest.mark.parametrize("resume, owned", [("auto", False), ("none", True)])
def test_stopped_before_its_first_save_resume_auto_or_its_own_restart_starts_afresh(
        tmp_path, resume, owned, caplog):
    """A preemption before the first checkpoint left events only: set aside, start again."""
    run = tmp_path / "run"
    (run / "tb").mkdir(parents=True)
    (run / "tb" / "events.out.tfevents.1.host").write_bytes(b"events")
    assert checkpoint.pick(resume, run, owned=owned) is None
    aside = [p for p in run.iterdir() if p.name.startswith("tb-before-")]
    assert len(aside) == 1 and (aside[0] / "events.out.tfevents.1.host").read_bytes() == b"events"
    assert not (run / "tb").exists()
    assert f"starting afresh, those events moved to {aside[0].name}" in caplog.text


def test_an_explicit_checkpoint_goes_into_an_empty_directory_only(tmp_path):
    old, _, _ = save_small(tmp_path / "old" / "checkpoints", 3)
    assert checkpoint.pick(str(old), tmp_path / "new", owned=False) == old
    # a run dir or a checkpoints dir means its newest checkpoint
    assert checkpoint.pick(str(tmp_path / "old"), tmp_path / "new", owned=False) == old
    taken = tmp_path / "taken"
    _finished_run_without_checkpoints(taken)
    with pytest.raises(ConfigError, match=f"which this run would overwrite: resume from {old} in"):
        checkpoint.pick(str(old), taken, owned=False)


def test_the_launch_that_wrote_there_continues_its_own(tmp_path):
    """A torchrun restart or a requeued SLURM job: its newest checkpoint, whatever
    trainer.resume says; if it died before its first one, it starts again as told."""
    run = tmp_path / "run"
    old, _, _ = save_small(tmp_path / "old" / "checkpoints", 3)
    _finished_run_without_checkpoints(run)  # its own events (and, say, files of a failed finish)
    assert checkpoint.pick("none", run, owned=True) is None
    assert checkpoint.pick(str(old), run, owned=True) == old
    mine, _, _ = save_small(run / "checkpoints", 2)
    for resume in ("none", "auto", str(old)):
        assert checkpoint.pick(resume, run, owned=True) == mine


def test_pick_refuses_a_bad_explicit_path(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        checkpoint.pick(str(tmp_path / "nope"), tmp_path / "run", owned=False)
    bad, _, _ = save_small(tmp_path / "ck", 3)
    (bad / "rank0.pt").unlink()
    with pytest.raises(ConfigError, match="rank0.pt is missing"):
        checkpoint.pick(str(bad), tmp_path / "run", owned=False)
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        checkpoint.pick(str(tmp_path / "ck"), tmp_path / "run", owned=False)


def test_choose_knows_the_launch_from_launches_json(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # this process counts as a torchrun worker
    run = tmp_path / "run"
    mine, _, _ = save_small(run / "checkpoints", 4)
    with pytest.raises(ConfigError, match="already holds an earlier run"):
        checkpoint.choose("none", run, ALONE)  # a stranger
    record_launch(run, launch_identity(), resumed_from=None)
    choice = checkpoint.choose("none", run, ALONE)
    assert choice == (mine, True, launch_identity())
    with pytest.raises(ConfigError, match="no such file"):
        checkpoint.choose(str(tmp_path / "missing"), tmp_path / "empty", ALONE)
