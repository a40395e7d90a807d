"""What the model is trained to do, and the metrics that say how well.

    classification   a target is one class id per input: accuracy and loss
    language_model   a target is the input's next token at each position:
                     loss, perplexity (exp of the loss), token accuracy, tokens/s
    regression       a target is a number or a vector of floats: the loss alone

The first two minimise cross-entropy over every target, so one loss and one set
of sums (loss x targets, correct, targets) serve both; only the names and the
derived figures differ. Regression minimises MSE, and its sums count samples.
`trainer.loss._target_` replaces any task's loss with a user's (a mean over the
batch). `data.task=auto` picks by the targets: floats are regression, else by shape.

A model fed dict batches (Hugging Face style, ddp_lab.models.calling) brings its own loss
(`own_loss`): its output's `.loss` is the training loss, and the sums count the labels its loss
scores (not -100, shifted by one in a causal LM), so the held-out figures stay exact.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from ddp_lab.config import ConfigError, targets
from ddp_lab.models.calling import IGNORE, aligned, loss_and_logits


@dataclass(frozen=True)
class Task:
    name: str
    held_out: str      # what the held-out split is called in metric names
    correct_name: str  # what a correct prediction is called ("": none, the loss is the figure)
    criterion: Callable | None = None  # trainer.loss (None: cross-entropy, or MSE for regression)
    own_loss: bool = False  # dict batches: the model's output carries its loss (and logits)
    shift: bool = False     # its loss scores the logits at t against the label at t + 1 (a causal LM)

    def loss(self, out, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every target: (N, C) against (N,), or (N, T, V) against (N, T);
        regression: (N, *shape) or (N, *shape, 1) against (N, *shape) floats. own_loss: the
        output's loss (trainer.loss, or cross-entropy where it has none, on its logits)."""
        if self.own_loss:
            own, logits = loss_and_logits(out)
            if own is not None and self.criterion is None:
                return own
            logits, y = aligned(logits, y, self.shift)
            if self.criterion is not None:
                return self.criterion(logits.float().flatten(0, -2), y.flatten())
            return F.cross_entropy(logits.float().flatten(0, -2), y.flatten(), ignore_index=IGNORE)
        if self.name == "regression":
            out = out.float()
            if out.dim() == y.dim() + 1 and out.shape[-1] == 1:  # nn.Linear(d, 1) against scalar targets
                out = out.squeeze(-1)
            return (self.criterion or F.mse_loss)(out, y.to(out.dtype))
        return (self.criterion or F.cross_entropy)(out.float().flatten(0, -2), y.flatten())

    @torch.no_grad()
    def accumulate(self, sums: torch.Tensor, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        """Add one batch's (loss x targets, correct predictions, targets) to `sums`, on the
        device: in place and with the count a Python int, so no step waits for the device.
        Regression counts samples (its loss is a mean over them), and no correct ones."""
        if self.own_loss:
            return self._accumulate_own(sums, loss, out, y)
        n = y.numel() if self.correct_name else len(y)
        sums[0] += loss.detach().double() * n
        if self.correct_name:
            sums[1] += (out.argmax(-1) == y).sum()
        sums[2] += n

    def _accumulate_own(self, sums: torch.Tensor, loss: torch.Tensor, out, y: torch.Tensor) -> None:
        """The model's loss is a mean over the labels it scores: those are counted (on the device)."""
        logits = loss_and_logits(out)[1]
        if logits is None:
            raise ConfigError("the model's output has a loss but no logits: the token and class metrics need "
                              "them; return them too (.logits or ['logits'])")
        logits, y = aligned(logits, y, self.shift)
        scored = y != IGNORE
        n = scored.sum()
        sums[0] += loss.detach().double() * n
        if self.correct_name:
            sums[1] += ((logits.argmax(-1) == y) & scored).sum()
        sums[2] += n

    def metrics(self, loss_sum: float, correct: float, n: float, split: str) -> dict:
        """The split's figures under their TensorBoard names, e.g. loss/val, ppl/val, token_acc/val."""
        loss = loss_sum / max(n, 1)
        out = {f"loss/{split}": loss}
        if self.correct_name:
            out[f"{self.correct_name}/{split}"] = correct / max(n, 1)
        if self.name == "language_model":
            out[f"ppl/{split}"] = math.exp(min(loss, 700.0))  # (exp overflows past ~709)
        return out

    @property
    def headline(self) -> str:
        """The held-out figure a run is judged by (in the closing line and the hparams table)."""
        return f"acc/{self.held_out}" if self.name == "classification" else f"loss/{self.held_out}"


CLASSIFICATION = Task("classification", "test", "acc")
LANGUAGE_MODEL = Task("language_model", "val", "token_acc")
REGRESSION = Task("regression", "test", "")
TASKS = {t.name: t for t in (CLASSIFICATION, LANGUAGE_MODEL, REGRESSION)}


def build_loss(node) -> Callable | None:
    """trainer.loss: None where `_target_` is unset; a class (torch.nn.HuberLoss) built with the
    other keys; a function (torch.nn.functional.l1_loss) called with them on every batch."""
    if node is None or not node.get("_target_"):
        return None
    fn = targets.resolve("trainer.loss", node)
    if isinstance(fn, type):
        return targets.build("trainer.loss", node)
    return functools.partial(fn, **targets.arguments("trainer.loss", node))


def summary_name(tb_name: str) -> str:
    """summary.json's name of a TensorBoard figure: acc/test -> test_acc, ppl/val -> val_ppl."""
    what, split = tb_name.split("/")
    return f"{split}_{what}"


def choose_task(setting: str, target: torch.Tensor, criterion: Callable | None = None) -> Task:
    """The task `data.task` names, or for auto the one one sample's target implies;
    with `criterion` (trainer.loss) as its loss."""
    floats = target.is_floating_point()
    if setting != "auto":
        task = TASKS[str(setting)]
    elif floats:
        task = REGRESSION
    elif target.dim() == 0:
        task = CLASSIFICATION
    elif target.dim() == 1:
        task = LANGUAGE_MODEL
    else:
        raise ConfigError(f"a target of shape {list(target.shape)} is neither a class id (a scalar) nor a "
                          f"token sequence (1-D): return one of these per input (or float targets: regression)")
    if task is not REGRESSION:
        if floats:
            raise ConfigError(f"data.task={task.name} takes integer class or token ids, but the data's targets "
                              f"are floats: set data.task=regression (or auto) to fit them by a loss "
                              f"(trainer.loss, MSE by default), or make them integers")
        wants = 0 if task is CLASSIFICATION else 1
        if target.dim() != wants:
            raise ConfigError(f"data.task={task.name} takes targets of {wants} dimension(s) per input, but the "
                              f"data's have shape {list(target.shape)}: set data.task=auto or fix the targets")
    return task if criterion is None else replace(task, criterion=criterion)
