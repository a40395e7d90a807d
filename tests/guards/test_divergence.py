"""A diverging run stops every rank at the step its loss stops being finite, saving nothing after."""
import math

import pytest
import torch

from ddp_lab import checkpoint
from ddp_lab.checkpoint.files import all_finite
from ddp_lab.config import RunFailed
from ddp_lab.distributed import DistEnv
from ddp_lab.guards.divergence import LossWatch
from tests.conftest import run_module, tiny_overrides

ALONE = DistEnv(0, 1, 0, torch.device("cpu"), "none")


def test_the_first_non_finite_loss_is_named(tmp_path):
    watch = LossWatch(ALONE, every=50, lr=1e6, amp="off")  # no params: judged by the loss
    for step, loss in enumerate([2.3, 1e30, math.inf, math.nan], start=1):
        if step < 3:
            watch.observe(torch.tensor(loss), step)
            continue
        with pytest.raises(RunFailed) as e:
            watch.observe(torch.tensor(loss), step)
        # the loss went bad at step 3 and stays named so at step 4
        assert str(e.value) == (
            "training diverged: the loss is not finite at step 3 (rank 0: inf); the learning "
            "rate optim.lr=1e+06 is likely too high: lower it, or warm up with "
            "optim.warmup_epochs. Nothing was saved from this step on")
    fp16 = LossWatch(ALONE, every=1, lr=0.1, amp="fp16")
    with pytest.raises(RunFailed, match="or fp16 overflowed: try trainer.amp=bf16 or off"):
        fp16.observe(torch.tensor(math.nan), 1)


def _rank1_nan_at_step_2(rank, world_size, nan_grads_on_every_rank):
    import torch.distributed as dist
    weight = torch.nn.Parameter(torch.zeros(3))
    watch = LossWatch(DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), 1, 0.2, "off", [weight])

    def no_collective(*args, **kwargs):
        raise AssertionError("the watch all-reduced in a step")
    all_reduce, dist.all_reduce = dist.all_reduce, no_collective
    try:
        weight.grad = torch.ones(3)
        watch.observe(torch.tensor(1.0), 1)
        # as after the gradient sync: rank 1's NaN is in every rank's averaged gradient
        weight.grad = torch.tensor([1.0, math.nan if nan_grads_on_every_rank else 1.0, 1.0])
        watch.observe(torch.tensor(math.nan if rank == 1 else 1.0), 2)
    except RunFailed as e:
        return str(e)
    finally:
        dist.all_reduce = all_reduce
    return "went on"


def test_every_rank_stops_at_the_step_one_rank_went_bad_without_a_collective():
    from tests.multiproc import run_in_processes
    got = run_in_processes(_rank1_nan_at_step_2, 3, True, timeout=60)
    assert len(set(got)) == 1
    assert got[0].startswith("training diverged: the loss is not finite at step 2 (rank 1: nan)")


def test_the_gradients_judge_a_step_and_a_finite_gradient_goes_on():
    weight = torch.nn.Parameter(torch.zeros(2))
    watch = LossWatch(ALONE, every=1, lr=0.1, amp="off", params=[weight])
    weight.grad = torch.tensor([1.0, 2.0])
    watch.observe(torch.tensor(math.inf), 1)  # a finite gradient: the step is good
    weight.grad = torch.tensor([1.0, math.inf])
    with pytest.raises(RunFailed) as e:
        watch.observe(torch.tensor(2.5), 2)
    assert str(e.value).startswith("training diverged: the gradients are not finite at step 2 "
                                   "(loss rank 0: 2.5); the learning rate optim.lr=0.1")


def test_clippings_norm_judges_a_step_without_a_second_pass_and_only_when_finite(monkeypatch):
    from ddp_lab.guards import divergence
    weight = torch.nn.Parameter(torch.zeros(2))
    watch = LossWatch(ALONE, every=1, lr=0.1, amp="off", params=[weight])
    passes = []
    monkeypatch.setattr(divergence, "grad_total", lambda params: passes.append(1) or torch.stack(
        [p.grad.abs().sum() for p in params]).sum())
    weight.grad = torch.tensor([1.0, 2.0])
    watch.observe(torch.tensor(1.0), 1, grad_norm=torch.tensor(2.24))  # finite: every gradient is
    assert passes == []
    weight.grad = torch.tensor([3e30, 3e30])  # finite, but their squares overflow the norm: not a divergence
    watch.observe(torch.tensor(1.0), 2, grad_norm=torch.tensor(math.inf))
    assert passes == [1]
    weight.grad = torch.tensor([1.0, math.nan])
    with pytest.raises(RunFailed, match="the gradients are not finite at step 3"):
        watch.observe(torch.tensor(1.0), 3, grad_norm=torch.tensor(math.nan))


@pytest.mark.system
def test_a_diverging_run_saves_no_nan_and_keeps_the_last_good_checkpoint(tiny_fmnist, tmp_path):
    run = tmp_path / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        "optim.lr=1e6", "trainer.ckpt_every_steps=1", "trainer.keep_ckpts=2", "trainer.amp=off"], nproc=0)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    step = int(errors[0].split("at step ")[1].split()[0])
    assert errors[0].startswith(f"ddp_lab: error: training diverged: the loss is not finite at "
                                f"step {step} (rank 0: ")
    assert "optim.lr=1e+06 is likely too high" in errors[0]
    assert not (run / "model.pt").exists() and not (run / "summary.json").exists()
    saved = [s for s, _ in checkpoint.step_dirs(run / "checkpoints")]
    assert saved == list(range(max(1, step - 2), step))  # the newest good ones, none after
    for _, path in checkpoint.step_dirs(run / "checkpoints"):
        assert checkpoint.problem(path) is None
        shared, _ = checkpoint.load(path, 0, torch.device("cpu"))
        assert all_finite(shared["model"]) and all_finite(shared["optimizer"]["state"][0])


@pytest.mark.system
def test_a_nan_on_one_rank_stops_both_at_that_step(tiny_fmnist, tmp_path):
    run = tmp_path / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        "trainer.ckpt_every_steps=2", "dist.timeout_s=60"], nproc=2,
        env={"DDP_LAB_FAULT": "rank=1,step=3,kind=nan"})
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error:")]
    assert len(errors) == 2, proc.stderr[-3000:]
    assert set(errors) == {"ddp_lab: error: training diverged: the loss is not finite at step 3 "
                           "(rank 1: nan); the learning rate optim.lr=0.2 is likely too high: "
                           "lower it, or warm up with optim.warmup_epochs. Nothing was saved "
                           "from this step on"}
    assert [s for s, _ in checkpoint.step_dirs(run / "checkpoints")] == [2]
