"""A classifier at chance at its first evaluation, its training loss not fallen: one warning.

Such a model is not learning, and the usual cause is a learning rate too high for
it (a user's CNN under the shipped SGD rate, 0.2, stays at chance): its weights
jump past every minimum and the outputs settle where every class is equally
likely. Said at the first evaluation, a run of hours is stopped after minutes.
Cross-entropy at chance (every class equally likely) is ln(classes); a model that
learns is well below it after its first epoch.
"""
from __future__ import annotations

import logging
import math

log = logging.getLogger("ddp_lab")

NEAR_CHANCE = 0.1  # at most this share of the way from chance to a perfect score
LOSS_FALLEN = 0.9  # a training loss below this share of ln(classes) has fallen


def chance_warning(acc: float, classes: int, train_loss: float, lr: float | None, split: str = "test") -> str | None:
    """The warning line where `acc` is at chance (1/classes) and the cross-entropy
    `train_loss` has not fallen below chance's ln(classes); else None."""
    if classes < 2 or not math.isfinite(train_loss):
        return None
    chance, floor = 1 / classes, math.log(classes)
    if acc > chance + NEAR_CHANCE * (1 - chance) or train_loss < LOSS_FALLEN * floor:
        return None
    now = f" (now {lr:g}, e.g. optim.lr={lr / 10:g})" if lr else ""
    return (f"the first evaluation's {split} accuracy {acc:.3f} is at chance (1/{classes} = {chance:.3f}) and the "
            f"training loss {train_loss:.4f} has not fallen below chance's ln({classes}) = {floor:.4f}: the model "
            f"is not learning; lower optim.lr{now}")


def warn_if_at_chance(metrics: dict, task, classes: int, last_loss, lr: float | None) -> None:
    """At a launch's first evaluation (the trainer calls this on rank 0 only), of a classifier
    trained by cross-entropy: warn if it is still at chance (`last_loss`: the last step's, rank 0's)."""
    if task.name != "classification" or task.criterion is not None or last_loss is None:
        return
    line = chance_warning(metrics[f"acc/{task.held_out}"], classes, float(last_loss), lr, task.held_out)
    if line is not None:
        log.warning("%s", line)
