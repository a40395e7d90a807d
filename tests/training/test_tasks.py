"""Tasks: which one the targets imply, one loss for both, and the figures each names."""
import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError
from ddp_lab.training.tasks import CLASSIFICATION, LANGUAGE_MODEL, REGRESSION, build_loss, choose_task, summary_name


def test_the_targets_shape_picks_the_task():
    assert choose_task("auto", torch.tensor(3)) is CLASSIFICATION
    assert choose_task("auto", torch.zeros(16, dtype=torch.long)) is LANGUAGE_MODEL
    with pytest.raises(ConfigError, match=r"a target of shape \[2, 2\] is neither"):
        choose_task("auto", torch.zeros(2, 2, dtype=torch.long))
    # floats of any shape are regression's; the integer tasks refuse them
    assert choose_task("auto", torch.tensor(0.5)) is REGRESSION
    assert choose_task("auto", torch.zeros(2, 2)) is REGRESSION
    assert choose_task("regression", torch.tensor(3)) is REGRESSION
    with pytest.raises(ConfigError) as e:
        choose_task("classification", torch.tensor(0.5))
    assert str(e.value) == ("data.task=classification takes integer class or token ids, but the data's targets are "
                            "floats: set data.task=regression (or auto) to fit them by a loss (trainer.loss, MSE by "
                            "default), or make them integers")
    with pytest.raises(ConfigError, match="data.task=language_model takes targets of 1 dimension"):
        choose_task("language_model", torch.tensor(3))


def test_one_loss_and_sums_serve_both_tasks():
    torch.manual_seed(0)
    out, y = torch.randn(4, 6, 11), torch.randint(0, 11, (4, 6))
    loss = LANGUAGE_MODEL.loss(out, y)
    assert loss.item() == pytest.approx(F.cross_entropy(out.reshape(24, 11), y.reshape(24)).item())
    sums = torch.zeros(3, dtype=torch.float64)
    LANGUAGE_MODEL.accumulate(sums, loss, out, y)
    loss_sum, correct, n = sums.tolist()
    assert n == 24 and loss_sum == pytest.approx(24 * loss.item())
    assert correct == (out.argmax(-1) == y).sum().item()


def test_each_task_names_its_figures():
    assert CLASSIFICATION.metrics(2.0, 3, 4, "test") == {"loss/test": 0.5, "acc/test": 0.75}
    lm = LANGUAGE_MODEL.metrics(2.0, 1, 4, "val")
    assert lm == {"loss/val": 0.5, "token_acc/val": 0.25, "ppl/val": pytest.approx(math.exp(0.5))}
    assert [summary_name(k) for k in lm] == ["val_loss", "val_token_acc", "val_ppl"]
    assert (CLASSIFICATION.headline, LANGUAGE_MODEL.headline) == ("acc/test", "loss/val")


def test_regression_is_the_loss_alone_a_mean_over_samples():
    out = torch.tensor([[1.0], [2.0], [4.0]])  # nn.Linear(d, 1) against scalar targets
    y = torch.tensor([1.0, 0.0, 1.0])
    loss = REGRESSION.loss(out, y)
    assert loss.item() == pytest.approx((0 + 4 + 9) / 3)  # MSE, the trailing 1 squeezed, not broadcast
    sums = torch.zeros(3, dtype=torch.float64)
    REGRESSION.accumulate(sums, loss, out, y)
    assert sums.tolist() == pytest.approx([13.0, 0.0, 3.0])  # (loss x samples, no correct ones, samples)
    assert REGRESSION.metrics(13.0, 0, 4, "test") == {"loss/test": 3.25}
    assert REGRESSION.headline == "loss/test" and summary_name(REGRESSION.headline) == "test_loss"


def test_a_users_loss_by_target_replaces_the_tasks():
    huber = build_loss(OmegaConf.create({"_target_": "torch.nn.HuberLoss", "delta": 0.5}))
    task = choose_task("auto", torch.tensor(0.5), huber)
    assert (task.name, task.headline) == ("regression", "loss/test")
    out, y = torch.tensor([[0.0], [2.0]]), torch.tensor([0.0, 0.0])
    assert task.loss(out, y).item() == pytest.approx((0 + 0.5 * (2 - 0.25)) / 2)  # quadratic, then linear
    # a function is called with the other keys as arguments
    l1 = build_loss(OmegaConf.create({"_target_": "torch.nn.functional.l1_loss", "reduction": "sum"}))
    assert choose_task("auto", y, l1).loss(out, y).item() == 2.0
    # a classifier keeps its accuracy under a loss of its own
    smooth = choose_task("auto", torch.tensor(1), build_loss(OmegaConf.create(
        {"_target_": "torch.nn.CrossEntropyLoss", "label_smoothing": 0.1})))
    logits, labels = torch.tensor([[2.0, 0.0]]), torch.tensor([0])
    assert smooth.name == "classification"
    assert smooth.loss(logits, labels).item() == pytest.approx(
        F.cross_entropy(logits, labels, label_smoothing=0.1).item())
    assert smooth.loss(logits, labels).item() != pytest.approx(CLASSIFICATION.loss(logits, labels).item())
    assert build_loss(OmegaConf.create({"_target_": None})) is None
    with pytest.raises(ConfigError, match="trainer.loss._target_=torch.nn.NoSuchLoss does not import"):
        build_loss(OmegaConf.create({"_target_": "torch.nn.NoSuchLoss"}))
