"""ddp_lab.checkpoint on its own: round trip, damaged checkpoints, pruning, refusal, choice."""
import json
import logging
import random
import signal

import pytest
import torch
from torch import nn

from ddp_lab import checkpoint
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv

CPU = torch.device("cpu")
ALONE = DistEnv(0, 1, 0, CPU, "none")


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _train(model, opt, sched, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(5, 4)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def _save(root, step, keep=5, subset=None, env=ALONE):
    model, opt, sched = _parts()
    _train(model, opt, sched, 2)
    shared = {"model": model.state_dict(), "optimizer": opt.state_dict(),
              "scheduler": sched.state_dict(), "step": step}
    subset = subset or {"optim": {"lr": 0.1}, "seed": 0}
    meta = {"config_hash": checkpoint.config_hash(subset), "config": subset}
    own = {"rng": checkpoint.rng_state(CPU), "sums": torch.tensor([1.5, 2.0, 3.0], dtype=torch.float64)}
    return checkpoint.save(root, step, env, own, shared, meta, keep), shared, own


def test_round_trip_restores_every_value(tmp_path):
    model, opt, sched = _parts(seed=1)
    _train(model, opt, sched, 3)
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

    fresh, fresh_opt, fresh_sched = _parts(seed=2)
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
    good, _, _ = _save(tmp_path, 2)
    # A save killed before its rename: a temp dir with part of the files, never read.
    tmp = tmp_path / ".tmp-step-4"
    tmp.mkdir()
    (tmp / "rank0.pt").write_bytes(b"half a file")
    assert checkpoint.newest(tmp_path) == good


def test_truncated_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    good, _, _ = _save(tmp_path, 2)
    bad, _, _ = _save(tmp_path, 4)
    state = bad / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        assert checkpoint.newest(tmp_path) == good
    assert "skipping checkpoint" in caplog.text and "step-4" in caplog.text
    assert "state.pt has" in caplog.text and "truncated" in caplog.text


def test_corrupt_byte_and_missing_meta_are_skipped(tmp_path, caplog):
    good, _, _ = _save(tmp_path, 2)
    flipped, _, _ = _save(tmp_path, 4)
    data = bytearray((flipped / "rank0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (flipped / "rank0.pt").write_bytes(bytes(data))
    no_meta, _, _ = _save(tmp_path, 6)
    (no_meta / "meta.json").unlink()
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        assert checkpoint.newest(tmp_path) == good
    assert "step-6: no meta.json" in caplog.text
    assert "rank0.pt does not match its checksum" in caplog.text


def test_prune_keeps_the_newest_and_clears_leftovers(tmp_path):
    for step in (1, 2, 3, 10):
        _save(tmp_path, step, keep=100)
    (tmp_path / ".tmp-step-11").mkdir()
    (tmp_path / ".old-step-3").mkdir()
    _save(tmp_path, 12, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-12"]


def test_saving_a_step_again_replaces_it(tmp_path):
    first, _, _ = _save(tmp_path, 5)
    (first / "stale").write_text("from the first save")
    again, _, _ = _save(tmp_path, 5)
    assert again == first and not (again / "stale").exists()
    assert checkpoint.problem(again) is None


# ---------------------------------------------------------------- config hash
def test_config_hash_ignores_settings_that_do_not_change_training(compose_train):
    base = checkpoint.config_subset(compose_train())
    same = checkpoint.config_subset(compose_train([
        "trainer.max_steps=3", "trainer.log_every=7", "trainer.resume=auto",
        "trainer.ckpt_every=5", "trainer.keep_ckpts=9", "data.root=/elsewhere",
        "data.num_workers=3", "dist.timeout_s=5", "trainer.progress=false",
        "model.crop_unused_border=false", "model.pad_channels_to=0", "sync.poll=false"]))
    assert checkpoint.config_hash(base) == checkpoint.config_hash(same)
    for change in ("optim.lr=0.05", "seed=1", "trainer.epochs=3", "trainer.grad_accum=2",
                   "data.batch_size=128", "model=resnet18", "sync.bucket_cap_mb=1"):
        other = checkpoint.config_subset(compose_train([change]))
        assert checkpoint.config_hash(other) != checkpoint.config_hash(base), change


def test_validate_names_world_size_and_differing_keys(compose_train):
    saved = checkpoint.config_subset(compose_train())
    meta = {"world_size": 2, "config_hash": checkpoint.config_hash(saved), "config": saved}
    checkpoint.validate("ck", meta, 2, saved)  # same: no error

    with pytest.raises(ConfigError) as e:
        checkpoint.validate("ck", meta, 4, saved)
    assert "world size 2 in the checkpoint vs 4 now" in str(e.value)
    assert "launch 2 processes" in str(e.value) and "new run directory" in str(e.value)
    assert "config" not in str(e.value).split("Either")[0]

    now = checkpoint.config_subset(compose_train(["optim.lr=0.05", "seed=3"]))
    with pytest.raises(ConfigError) as e:
        checkpoint.validate("ck", meta, 2, now)
    msg = str(e.value)
    assert "config hash differs" in msg
    assert "optim.lr: 0.2 in the checkpoint vs 0.05 now" in msg
    assert "seed: 0 in the checkpoint vs 3 now" in msg
    assert "world size" not in msg


def test_a_checkpoint_that_hashed_a_key_now_left_out_still_resumes(compose_train):
    now = checkpoint.config_subset(compose_train())
    older = {g: dict(v) if isinstance(v, dict) else v for g, v in now.items()}
    older["model"]["crop_unused_border"] = False  # hashed when that checkpoint was written
    meta = {"world_size": 2, "config_hash": checkpoint.config_hash(older), "config": older}
    checkpoint.validate("ck", meta, 2, now)  # no error
    older["optim"]["lr"] = 0.05  # a key that still counts still refuses
    with pytest.raises(ConfigError, match="optim.lr: 0.05 in the checkpoint vs 0.2 now"):
        checkpoint.validate("ck", meta, 2, now)


# ---------------------------------------------------------------- which one to resume
def test_pick_follows_restart_and_trainer_resume(tmp_path):
    run_root = tmp_path / "run" / "checkpoints"
    other = tmp_path / "other" / "checkpoints"
    assert checkpoint.pick("none", run_root, restarted=False) is None
    assert checkpoint.pick("auto", run_root, restarted=False) is None  # nothing there yet
    old, _, _ = _save(other, 3)
    # a restart before this run's first save goes back to what the launch was told
    assert checkpoint.pick(str(old), run_root, restarted=True) == old
    mine, _, _ = _save(run_root, 2)
    assert checkpoint.pick("none", run_root, restarted=True) == mine
    assert checkpoint.pick(str(old), run_root, restarted=True) == mine
    assert checkpoint.pick("auto", run_root, restarted=False) == mine
    # a run dir or a checkpoints dir means its newest checkpoint
    assert checkpoint.pick(str(tmp_path / "other"), run_root, restarted=False) == old
    assert checkpoint.pick(str(other), run_root, restarted=False) == old


def test_a_fresh_run_refuses_to_overwrite_an_earlier_one(tmp_path):
    run_root = tmp_path / "run" / "checkpoints"
    _save(run_root, 2)
    _save(run_root, 5)
    with pytest.raises(ConfigError) as e:
        checkpoint.pick("none", run_root, restarted=False)
    assert str(e.value) == (
        f"{tmp_path / 'run'} already holds an earlier run (checkpoints up to step-5), which a new "
        "run there would overwrite. Continue it with trainer.resume=auto, or start afresh in "
        "another directory (hydra.run.dir=...)")
    # a finished run that kept no checkpoints (trainer.keep_ckpts=0) is protected too
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.pt").write_bytes(b"weights")
    with pytest.raises(ConfigError, match=r"already holds an earlier run \(model.pt\)"):
        checkpoint.pick("none", bare / "checkpoints", restarted=False)


def test_pick_refuses_a_bad_explicit_path(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        checkpoint.pick(str(tmp_path / "nope"), tmp_path, restarted=False)
    bad, _, _ = _save(tmp_path / "ck", 3)
    (bad / "rank0.pt").unlink()
    with pytest.raises(ConfigError, match="rank0.pt is missing"):
        checkpoint.pick(str(bad), tmp_path, restarted=False)
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        checkpoint.pick(str(tmp_path / "ck"), tmp_path, restarted=False)


def test_choose_alone_reads_the_restart_count(tmp_path, monkeypatch):
    mine, _, _ = _save(tmp_path, 4)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(ConfigError, match="already holds an earlier run"):
        checkpoint.choose("none", tmp_path, ALONE)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert checkpoint.choose("none", tmp_path, ALONE) == mine
    with pytest.raises(ConfigError):
        checkpoint.choose(str(tmp_path / "missing"), tmp_path / "empty", ALONE)


def test_numpy_and_python_rng_states_load_with_weights_only(tmp_path):
    np = pytest.importorskip("numpy")
    np.random.seed(3)
    state = checkpoint.rng_state(CPU)
    expected = np.random.rand(4)
    torch.save(state, tmp_path / "rng.pt")
    np.random.seed(0)
    checkpoint.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), CPU)
    assert (np.random.rand(4) == expected).all()


def test_sigterm_raises_terminated_and_exits_143():
    from ddp_lab.train import Terminated, stop_on_sigterm
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(Terminated) as e:
            signal.raise_signal(signal.SIGTERM)
        assert e.value.code == 143
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one kills outright
    finally:
        signal.signal(signal.SIGTERM, previous)
