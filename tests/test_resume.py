"""Resume: mid-epoch, after a killed rank, and refusal of a checkpoint that does not fit.

The in-process tests drive a Trainer directly (one rank, no torchrun); the
slow ones launch torchrun on the tiny Fashion-MNIST (8 steps per epoch).
"""
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ddp_lab.training.trainer import Trainer
from tests.conftest import fit_alone, read_summary, run_module, tiny_overrides


def _same_weights(a, b) -> None:
    wa = torch.load(a / "model.pt", weights_only=True)
    wb = torch.load(b / "model.pt", weights_only=True)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def _fit(compose_train, data, run_dir, extra=()):
    """A one-rank run in this process; returns its summary."""
    return fit_alone(compose_train, data, run_dir, extra)


def test_resume_mid_epoch_matches_the_uninterrupted_run(compose_train, tiny_fmnist, tmp_path):
    full = _fit(compose_train, tiny_fmnist, tmp_path / "full",
                ["trainer.ckpt_every_steps=3", "trainer.keep_ckpts=10"])
    ckpts = tmp_path / "full" / "checkpoints"
    # every 3 steps, plus both epoch ends (8, 16); 15 is 3*5 inside epoch 2
    assert sorted(int(p.name[5:]) for p in ckpts.iterdir()) == [3, 6, 8, 9, 12, 15, 16]
    meta = json.loads((ckpts / "step-9" / "meta.json").read_text())
    assert (meta["epoch"], meta["batches_done"], meta["world_size"]) == (1, 1, 1)

    resumed = _fit(compose_train, tiny_fmnist, tmp_path / "resumed",
                   [f"trainer.resume={ckpts / 'step-9'}"])  # epoch 2, after its first batch
    _same_weights(tmp_path / "full", tmp_path / "resumed")
    # the partial epoch's sums came along, so epoch 2's metrics are the same too
    assert resumed["train_loss"] == full["train_loss"]
    assert resumed["train_acc"] == full["train_acc"]
    assert resumed["test_correct"] == full["test_correct"]
    assert (resumed["steps"], resumed["epochs"]) == (16, 2)


def test_a_resumed_epoch_counts_its_time_before_the_restart(compose_train, tiny_fmnist, tmp_path,
                                                             monkeypatch):
    """sec/epoch of an epoch resumed mid-way adds the time it ran before the checkpoint
    (carried in it), not only the resumed part's."""
    run_batch = Trainer._run_batch

    def slow_step_9(self, micro):  # epoch 2's first step takes 1 s more, before step-9's save
        if self.step == 8:
            time.sleep(1.0)
        run_batch(self, micro)

    monkeypatch.setattr(Trainer, "_run_batch", slow_step_9)
    _fit(compose_train, tiny_fmnist, tmp_path / "full", ["trainer.ckpt_every_steps=3", "trainer.keep_ckpts=10"])
    monkeypatch.undo()
    ckpts = tmp_path / "full" / "checkpoints"
    state = {n: torch.load(ckpts / f"step-{n}" / "state.pt", weights_only=True) for n in (8, 9)}
    assert state[8]["epoch_elapsed_s"] == 0.0  # saved at epoch 1's end: no epoch under way
    carried = state[9]["epoch_elapsed_s"]  # epoch 2, after its first (slow) step
    assert carried >= 1.0

    resumed = _fit(compose_train, tiny_fmnist, tmp_path / "resumed", [f"trainer.resume={ckpts / 'step-9'}"])
    epoch1 = state[9]["epoch_seconds"][0]
    epoch2 = 2 * resumed["sec_per_epoch"] - epoch1  # the mean of the two epochs
    assert epoch2 >= carried  # the resumed part alone takes a fraction of a second


def test_stop_at_max_steps_then_resume_auto(compose_train, tiny_fmnist, tmp_path):
    """max_steps stops mid-epoch and saves there; trainer.resume=auto finishes the run."""
    const = ["optim.schedule=constant"]  # cosine would plan its decay over max_steps
    full = _fit(compose_train, tiny_fmnist, tmp_path / "full", const)
    part = _fit(compose_train, tiny_fmnist, tmp_path / "part", const + ["trainer.max_steps=5"])
    assert part["steps"] == 5
    assert [p.name for p in (tmp_path / "part" / "checkpoints").iterdir()] == ["step-5"]
    rest = _fit(compose_train, tiny_fmnist, tmp_path / "part", const + ["trainer.resume=auto"])
    assert rest["steps"] == 16 and rest["train_loss"] == full["train_loss"]
    _same_weights(tmp_path / "full", tmp_path / "part")


# ---------------------------------------------------------------- under torchrun
CKPT = ["trainer.amp=off", "trainer.ckpt_every_steps=3", "trainer.keep_ckpts=10", "dist.timeout_s=60"]
KILL = {"DDP_LAB_FAULT": "rank=1,step=11,kind=kill"}  # SIGKILL rank 1 after step 11


@pytest.fixture(scope="module")
def reference(tiny_fmnist, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run_dir) + ["trainer.amp=off"],
                      nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def killed(tiny_fmnist, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run_dir) + CKPT, nproc=2,
                      torchrun_args=["--max-restarts=1"], env=KILL)
    return run_dir, proc


@pytest.mark.system
def test_sigkilled_rank_restarts_and_ends_bit_identical(reference, killed):
    run_dir, proc = killed
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DDP_LAB_FAULT: rank 1 sends itself SIGKILL after step 11" in proc.stderr
    # torchrun names the failure with the earliest timestamp (whole seconds, ties by
    # local rank): rank 1's SIGKILL; or, when torchrun saw rank 0 end in the same poll,
    # rank 0, with its error at the allreduce rank 1 never joined (1) or with the SIGTERM
    # torchrun sends the survivors (-15)
    assert re.search(r"failed \(exitcode: (-9\) local_rank: 1|(1|-15)\) local_rank: 0) ",
                     proc.stderr), proc.stderr[-3000:]
    # the restart went on from the newest checkpoint before the kill: step 9 (epoch 2, batch 1)
    assert f"resumed from {run_dir / 'checkpoints' / 'step-9'} (step 9, epoch 2, batch 1)" in proc.stdout
    assert proc.stdout.count("epoch 2/2") == 1
    _same_weights(reference, run_dir)
    a, b = read_summary(reference), read_summary(run_dir)
    assert (b["steps"], b["epochs"], b["world_size"]) == (16, 2, 2)
    assert b["train_loss"] == a["train_loss"] and b["test_correct"] == a["test_correct"]
    # both ranks wrote their own RNG file into every checkpoint
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step-15").iterdir()) == [
        "meta.json", "rank0.pt", "rank1.pt", "state.pt"]


@pytest.mark.system
def test_refuses_a_checkpoint_of_another_config(killed, tiny_fmnist, tmp_path):
    run_dir, _ = killed
    step = run_dir / "checkpoints" / "step-3"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, tmp_path / "run") + CKPT + [
        f"trainer.resume={step}", "optim.lr=0.05"], nproc=0)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddp_lab: error:")]
    assert len(errors) == 1
    assert f"cannot resume from {step}" in errors[0]
    assert "world size" not in errors[0]  # another world size alone is fine (test_reshard.py)
    assert "optim.lr: 0.2 in the checkpoint vs 0.05 now" in errors[0]
    assert "start a new run directory" in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.system
def test_resumed_at_its_last_step_a_run_writes_its_results(tmp_path):
    """A finished run whose model.pt and summary.json are gone, launched again with
    trainer.resume=auto: no step is left to run, so nothing is measured in this launch
    (the straggler's ratio was 0/0, which the JSON writer refused); it must still end
    with both files, the measured figures null and the carried ones kept."""
    run_dir = tmp_path / "run"
    args = ["data=synthetic", "data.num_train=2048", "data.num_test=512", "trainer.epochs=1",
            "trainer.compile=false", "trainer.progress=false", f"hydra.run.dir={run_dir}"]
    first = run_module("ddp_lab.train", args, nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    before = read_summary(run_dir)
    (run_dir / "summary.json").unlink()
    (run_dir / "model.pt").unlink()

    again = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run_dir / "model.pt").exists()
    text = (run_dir / "summary.json").read_text()
    after = json.loads(text, parse_constant=lambda c: pytest.fail(f"summary.json holds {c}"))
    assert (after["steps"], after["epochs"], after["measured_steps"]) == (4, 1, 0)  # 2048 / 512
    assert after["samples_per_sec"] is None and after["mfu"] is None and after["straggler"] is None
    assert after["step_ms"] is None and after["data_ms"] is None
    for carried in ("test_acc", "test_correct", "train_loss", "sec_per_epoch"):
        assert after[carried] == before[carried], carried
    assert "n/a img/s on 2 x cpu (gloo), MFU n/a" in again.stdout


# ---------------------------------------------------------------- a preemption
# synthetic, 256 steps an epoch: the agent's SIGTERM reaches the ranks mid-epoch
LONG = ["data=synthetic", "data.num_train=16384", "data.num_test=512", "trainer.amp=off",
        "trainer.compile=false", "trainer.log_every=50"]


@pytest.mark.system
def test_sigterm_to_the_agent_saves_the_step_in_flight_and_resume_ends_bit_identical(
        tiny_fmnist, tmp_path):
    def args(name):
        return tiny_overrides(tiny_fmnist, tmp_path / name) + LONG

    with ThreadPoolExecutor(1) as pool:  # the uninterrupted run beside the cut one and its resume
        alone = pool.submit(run_module, "ddp_lab.train", args("alone"), nproc=2)
        cut = run_module("ddp_lab.train", args("cut"), nproc=2,
                         env={"DDP_LAB_FAULT": "rank=1,step=20,kind=term"})
        assert cut.returncode != 0  # torchrun itself ends on the signal
        logs = "".join((tmp_path / "cut" / f"rank{r}.log").read_text() for r in (0, 1))
        saved = re.findall(r"rank (\d): saved checkpoint step-(\d+) ([\d.]+) s after SIGTERM to rank",
                           logs)
        assert sorted(r for r, _, _ in saved) == ["0", "1"], logs[-3000:]
        step = int(saved[0][1])
        assert saved[1][1] == saved[0][1] and 20 < step < 512
        assert all(float(took) < 20 for _, _, took in saved)  # trainer.preempt_save_s
        newest = max((tmp_path / "cut" / "checkpoints").iterdir(), key=lambda p: int(p.name[5:]))
        assert newest.name == f"step-{step}" and (newest / "meta.json").exists()
        assert not (tmp_path / "cut" / "summary.json").exists()

        rest = run_module("ddp_lab.train", args("cut") + ["trainer.resume=auto"], nproc=2)
        assert rest.returncode == 0, rest.stderr[-3000:]
        assert f"resumed from {newest} (step {step}," in rest.stdout
        alone = alone.result()
    assert alone.returncode == 0, alone.stderr[-3000:]
    _same_weights(tmp_path / "alone", tmp_path / "cut")
    a, b = read_summary(tmp_path / "alone"), read_summary(tmp_path / "cut")
    assert (b["steps"], b["train_loss"], b["test_correct"]) == (a["steps"], a["train_loss"],
                                                                a["test_correct"])
