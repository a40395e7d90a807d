"""A classifier at chance at its first evaluation, its training loss not fallen: one warning line."""
import logging
import math

import pytest
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry.chance import chance_warning
from ddp_lab.training.trainer import Trainer


def test_the_warning_names_the_accuracy_chance_the_loss_and_the_fix():
    assert chance_warning(0.1, 10, 2.3026, 0.2) == (
        "the first evaluation's test accuracy 0.100 is at chance (1/10 = 0.100) and the training loss 2.3026 has "
        "not fallen below chance's ln(10) = 2.3026: the model is not learning; lower optim.lr (now 0.2, e.g. "
        "optim.lr=0.02)")
    assert chance_warning(0.19, 10, 2.5, None, "val").startswith("the first evaluation's val accuracy 0.190")
    assert chance_warning(0.19, 10, 2.5, None).endswith("not learning; lower optim.lr")


@pytest.mark.parametrize("acc,classes,loss", [
    (0.2, 10, 2.3026),           # above chance (0.1 + a tenth of the way to 1 = 0.19)
    (0.1, 10, 0.9 * math.log(10) - 0.01),  # the loss has fallen
    (0.56, 2, 0.69),             # two classes: chance 0.5, near it up to 0.55
    (1.0, 1, 0.0),               # one class: no chance to speak of
    (0.1, 10, float("nan")),     # a diverged loss is the divergence guard's to say
])
def test_no_warning_where_the_model_learns_or_cannot_be_judged(acc, classes, loss):
    assert chance_warning(acc, classes, loss, 0.2) is None


def _fit(compose_train, tmp_path, model: str) -> tuple[dict, str]:
    cfg = compose_train(["model=custom", f"model._target_=tests.workloads.{model}", "data=custom",
                         "data._target_=tests.workloads.blobs", "data.batch_size=64", "trainer.epochs=1",
                         "trainer.progress=false", "trainer.compile=false", "trainer.amp=off"])
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path / model)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def test_a_network_that_does_not_learn_is_warned_about_at_its_first_evaluation(compose_train, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        learns = _fit(compose_train, tmp_path, "linear")  # the shipped SGD rate 0.2: fine for this one
    assert learns["test_acc"] > 0.9 and "at chance" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        stuck = _fit(compose_train, tmp_path, "dead_relus")
    warnings = [r.getMessage() for r in caplog.records if "at chance" in r.getMessage()]
    assert len(warnings) == 1 and stuck["test_acc"] < 0.35
    assert warnings[0].startswith(f"the first evaluation's test accuracy {stuck['test_acc']:.3f} is at chance "
                                  f"(1/4 = 0.250) and the training loss ")
    assert warnings[0].endswith("has not fallen below chance's ln(4) = 1.3863: the model is not learning; lower "
                                "optim.lr (now 0.2, e.g. optim.lr=0.02)")
