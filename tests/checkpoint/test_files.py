"""Checkpoints on disk: round trip, damaged ones skipped, pruning, a full disk."""
import errno
import json
import logging
import random

import pytest
import torch

from ddp_lab import checkpoint
from ddp_lab.config import RunFailed
from tests.checkpoint.conftest import ALONE, CPU, parts, save_small, train_steps


def test_round_trip_restores_every_value(tmp_path):
    model, opt, sched = parts(seed=1)
    train_steps(model, opt, sched, 3)
    random.seed(7)
    torch.manual_seed(7)
    shared = {"model": model.state_dict(), "optimizer": opt.state_dict(),
              "scheduler": sched.state_dict(), "epoch": 1, "batches_done": 4,
              "last": {"acc/test": 0.5}, "epoch_seconds": [1.25]}
    own = {"rng": checkpoint.rng_state(CPU), "sums": torch.tensor([3.5, 2.0, 4.0], dtype=torch.float64)}
    path = checkpoint.save(tmp_path, 3, ALONE, own, shared, {"config_hash": "x", "config": {}}, 2)
    expected = (random.random(), torch.rand(3))  # what the RNGs give right after the save

    assert path == tmp_path / "step-3" and checkpoint.problem(path) is None
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "rank0.pt", "state.pt"]
    got_shared, got_own = checkpoint.load(path, 0, CPU)  # weights_only=True inside

    fresh, fresh_opt, fresh_sched = parts(seed=2)
    fresh.load_state_dict(got_shared["model"])
    fresh_opt.load_state_dict(got_shared["optimizer"])
    fresh_sched.load_state_dict(got_shared["scheduler"])
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], fresh_opt.state[q]["momentum_buffer"])
    assert fresh_sched.last_epoch == sched.last_epoch == 3
    assert fresh_sched.get_last_lr() == sched.get_last_lr()
    assert (got_shared["epoch"], got_shared["batches_done"]) == (1, 4)
    assert got_shared["last"] == {"acc/test": 0.5} and got_shared["epoch_seconds"] == [1.25]
    assert torch.equal(got_own["sums"], own["sums"])

    random.seed(99)
    torch.manual_seed(99)
    checkpoint.set_rng_state(got_own["rng"], CPU)
    again = (random.random(), torch.rand(3))
    assert again[0] == expected[0] and torch.equal(again[1], expected[1])

    meta = json.loads((path / "meta.json").read_text())
    assert meta["world_size"] == 1 and meta["step"] == 3
    assert set(meta["files"]) == {"rank0.pt", "state.pt"}


def test_kill_mid_write_leaves_the_previous_checkpoint(tmp_path):
    good, _, _ = save_small(tmp_path, 2)
    # A save killed before its rename: a temp dir with part of the files, never read.
    tmp = tmp_path / ".tmp-step-4"
    tmp.mkdir()
    (tmp / "rank0.pt").write_bytes(b"half a file")
    assert checkpoint.newest(tmp_path) == good


def test_truncated_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    good, _, _ = save_small(tmp_path, 2)
    bad, _, _ = save_small(tmp_path, 4)
    state = bad / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        assert checkpoint.newest(tmp_path) == good
    assert "skipping checkpoint" in caplog.text and "step-4" in caplog.text
    assert "state.pt has" in caplog.text and "truncated" in caplog.text


def test_corrupt_byte_and_missing_meta_are_skipped(tmp_path, caplog):
    good, _, _ = save_small(tmp_path, 2)
    flipped, _, _ = save_small(tmp_path, 4)
    data = bytearray((flipped / "rank0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (flipped / "rank0.pt").write_bytes(bytes(data))
    no_meta, _, _ = save_small(tmp_path, 6)
    (no_meta / "meta.json").unlink()
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        assert checkpoint.newest(tmp_path) == good
    assert "step-6: no meta.json" in caplog.text
    assert "rank0.pt does not match its checksum" in caplog.text


def test_prune_keeps_the_newest_and_clears_leftovers(tmp_path):
    for step in (1, 2, 3, 10):
        save_small(tmp_path, step, keep=100)
    (tmp_path / ".tmp-step-11").mkdir()
    (tmp_path / ".old-step-3").mkdir()
    save_small(tmp_path, 12, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-12"]


def test_saving_a_step_again_replaces_it(tmp_path):
    first, _, _ = save_small(tmp_path, 5)
    (first / "stale").write_text("from the first save")
    again, _, _ = save_small(tmp_path, 5)
    assert again == first and not (again / "stale").exists()
    assert checkpoint.problem(again) is None




def test_prune_never_removes_the_checkpoint_just_written(tmp_path):
    """Resumed from step 4 while a later step-9 (damaged, or of an abandoned attempt)
    sits there: with keep=1 the new step-6 stays and step-9 is not this save's to judge."""
    for step in (2, 4, 9):
        save_small(tmp_path, step, keep=100)
    save_small(tmp_path, 6, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-6", "step-9"]


def _disk_fills_up(monkeypatch, after_bytes: int):
    """torch.save inside ddp_lab.checkpoint writes `after_bytes`, then the disk is full."""
    real_save = torch.save

    def save(obj, f):
        real_save(obj, f)
        if f.tell() > after_bytes:
            f.truncate(after_bytes)
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.files.torch, "save", save)


def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    good, shared, _ = save_small(tmp_path, 2)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    _disk_fills_up(monkeypatch, after_bytes=100)
    with pytest.raises(RunFailed) as e:
        save_small(tmp_path, 4)
    needed = checkpoint.files.nbytes(shared) / 2**20
    assert str(e.value).startswith(
        f"no space left on {tmp_path} while writing checkpoint step-4 (it needs about ")
    assert f"{needed:.1f} MB)" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]  # no .tmp-step-4
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    assert checkpoint.newest(tmp_path) == good


def _save_where_rank1_cannot_write(rank, world_size, root):
    from ddp_lab.distributed import DistEnv
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    if rank == 1:
        def no_room(obj, f):
            raise OSError(errno.ENOSPC, "No space left on device")
        checkpoint.files.torch.save = no_room  # this process only
    try:
        save_small(root, 3, env=env)
    except RunFailed as e:
        return str(e)
    return "saved"


def test_one_rank_failing_to_write_stops_every_rank_with_its_reason(tmp_path):
    from tests.multiproc import run_in_processes
    got = run_in_processes(_save_where_rank1_cannot_write, 2, str(tmp_path), timeout=60)
    assert got[1].startswith(f"no space left on {tmp_path} while writing checkpoint step-3")
    assert got[0] == "rank 1: " + got[1]
    assert list(tmp_path.iterdir()) == []  # the temporary is gone, nothing was published
