"""A long evaluation says how far it is: rank 0 logs a line every PROGRESS_EVERY_S once
PROGRESS_FIRST_S have passed; a short one, or another rank, says nothing."""
import logging

import pytest
import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.training import evaluation
from ddp_lab.training.evaluation import evaluate

CPU = torch.device("cpu")


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Batches:
    """`n` held-out batches, each taking `seconds` of the fake clock to score; `sized`: has a len()."""

    def __init__(self, n: int, clock: FakeClock, seconds: float, sized: bool = True):
        self.n, self.clock, self.seconds, self.sized = n, clock, seconds, sized

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return self.n

    def epoch(self, epoch):
        for _ in range(self.n):
            self.clock.now += self.seconds
            yield torch.ones(2, 4), torch.zeros(2, dtype=torch.long)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(evaluation, "clock", fake)
    monkeypatch.setattr(evaluation, "PROGRESS_FIRST_S", 5.0)
    monkeypatch.setattr(evaluation, "PROGRESS_EVERY_S", 10.0)
    return fake


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ddp_lab"]


def _evaluate(batches, rank: int = 0):
    return evaluate(nn.Linear(4, 3), batches, DistEnv(rank, 1, 0, CPU, "none"))


def test_a_long_evaluation_logs_a_line_after_5_s_then_every_10_s(clock, caplog):
    caplog.set_level(logging.INFO, logger="ddp_lab")
    # 1,300 batches of 1/32 s (exact in binary): 40.6 s in all; lines at 5, 15, 25 and 35 s
    loss_sum, correct, total = _evaluate(_Batches(1300, clock, 1 / 32))
    assert total == 2600  # the figures themselves unchanged
    assert _lines(caplog) == [
        "evaluating: 160 of 1,300 batches (12%), 5 s",
        "evaluating: 480 of 1,300 batches (37%), 15 s",
        "evaluating: 800 of 1,300 batches (62%), 25 s",
        "evaluating: 1,120 of 1,300 batches (86%), 35 s",
    ]


def test_a_short_evaluation_says_nothing(clock, caplog):
    caplog.set_level(logging.INFO, logger="ddp_lab")
    _evaluate(_Batches(40, clock, 0.1))  # 4 s
    assert _lines(caplog) == []


def test_only_rank_0_says_how_far_it_is(clock, caplog):
    caplog.set_level(logging.INFO, logger="ddp_lab")
    evaluate(nn.Linear(4, 3), _Batches(100, clock, 1.0), DistEnv(1, 2, 0, CPU, "none"))
    assert _lines(caplog) == []


def test_slow_batches_skip_the_ticks_they_span_and_no_length_counts_alone(clock, caplog):
    caplog.set_level(logging.INFO, logger="ddp_lab")
    # 12 s per batch: 12 s (the 5 s tick passed), 24 s (15 s), 36 s (25 and 35 s at once: one line)
    _evaluate(_Batches(3, clock, 12.0, sized=False))
    assert _lines(caplog) == ["evaluating: 1 batch, 12 s", "evaluating: 2 batches, 24 s",
                              "evaluating: 3 batches, 36 s"]


def test_the_intervals_are_the_module_constants(clock, caplog, monkeypatch):
    monkeypatch.setattr(evaluation, "PROGRESS_FIRST_S", 1.0)
    monkeypatch.setattr(evaluation, "PROGRESS_EVERY_S", 2.0)
    caplog.set_level(logging.INFO, logger="ddp_lab")
    _evaluate(_Batches(6, clock, 1.0))  # lines at 1, 3 and 5 s
    assert _lines(caplog) == ["evaluating: 1 of 6 batches (17%), 1 s", "evaluating: 3 of 6 batches (50%), 3 s",
                              "evaluating: 5 of 6 batches (83%), 5 s"]
