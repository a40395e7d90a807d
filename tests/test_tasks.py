"""Tasks: which one the targets imply, one loss for both, and the figures each names."""
import math

import pytest
import torch
import torch.nn.functional as F

from ddp_lab.config import ConfigError
from ddp_lab.tasks import CLASSIFICATION, LANGUAGE_MODEL, choose_task, summary_name


def test_the_targets_shape_picks_the_task():
    assert choose_task("auto", torch.tensor(3)) is CLASSIFICATION
    assert choose_task("auto", torch.zeros(16, dtype=torch.long)) is LANGUAGE_MODEL
    with pytest.raises(ConfigError, match=r"a target of shape \[2, 2\] is neither"):
        choose_task("auto", torch.zeros(2, 2))
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
