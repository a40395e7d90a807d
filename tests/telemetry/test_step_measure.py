"""trainer.measure: what each level measures, and that what it leaves out is NaN, never 0."""
import math

import pytest
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry.meter import Meter
from ddp_lab.telemetry.step_measure import StepMeasure
from ddp_lab.training.tasks import CLASSIFICATION
from ddp_lab.training.trainer import Trainer
from tests.conftest import fit_alone, tiny_overrides

ENV = DistEnv(0, 1, 0, torch.device("cpu"), "none")


class _Sync:
    measuring, wire_bytes, collectives = True, 0, 0

    def comm_figures(self, steps, seconds):
        return math.nan, math.nan


class _Profiler:
    steps = 0

    def step(self):
        self.steps += 1


def _one_step(level: str) -> tuple[dict, StepMeasure]:
    meter, sync = Meter(ENV, warmup_steps=0, task=CLASSIFICATION), _Sync()
    measure = StepMeasure(level, meter, sync, _Profiler())
    meter.start_epoch()
    measure.step_starts(4)
    out, y = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 0.0]]), torch.tensor([0, 1, 1, 1])
    measure.batch_done(torch.tensor(0.5), out, y)
    measure.synced()
    measure.step_done()
    return meter.end_epoch(0.1, sync), measure


def test_full_counts_loss_and_accuracy():
    figures, measure = _one_step("full")
    assert figures["loss/train"] == pytest.approx(0.5)
    assert figures["acc/train"] == pytest.approx(0.5)  # 2 of 4 right
    assert measure.sync.measuring is True and measure.profiler.steps == 1


def test_light_counts_the_loss_only():
    figures, measure = _one_step("light")
    assert figures["loss/train"] == pytest.approx(0.5)
    assert math.isnan(figures["acc/train"])
    assert measure.sync.measuring is False  # no communication timing
    assert measure.straggler(1.2) is None and measure.log_step() == {}


def test_off_counts_neither_but_keeps_the_throughput_clock():
    figures, measure = _one_step("off")
    assert math.isnan(figures["loss/train"]) and math.isnan(figures["acc/train"])
    assert measure.meter.throughput.steps == 1  # the step still counts for images/s


@pytest.mark.parametrize("level", ["full", "light", "off"])
def test_only_full_puts_a_hook_on_the_parameters(compose_train, tiny_fmnist, tmp_path, level):
    args = [o for o in tiny_overrides(tiny_fmnist, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.amp=off", "trainer.threads=1", f"trainer.measure={level}"])
    trainer = Trainer.from_config(cfg, ENV, tmp_path)
    try:
        assert (trainer.measure.step_timer is not None) == (level == "full")
        hooked = [bool(p._post_accumulate_grad_hooks) for p in trainer.model.parameters()]
        assert hooked == [level == "full"] * len(hooked)
    finally:
        trainer.close()


def test_a_run_at_level_off_trains_and_says_what_it_did_not_measure(compose_train, tiny_fmnist, tmp_path):
    full = fit_alone(compose_train, tiny_fmnist, tmp_path / "full", ["trainer.max_steps=6"])
    off = fit_alone(compose_train, tiny_fmnist, tmp_path / "off", ["trainer.max_steps=6", "trainer.measure=off"])
    assert off["test_acc"] == full["test_acc"]  # the same training: measuring changes no weight
    assert math.isfinite(full["train_loss"]) and not math.isfinite(off.get("train_loss") or math.nan)
    assert off["samples_per_sec"] > 0
