"""When a run logs, evaluates and saves: the schedule's answers, asked as the Trainer's loop asks them."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest

from ddp_lab.config.schema import TrainerConfig
from ddp_lab.training.schedule import Schedule


def schedule(epochs: int, batches_per_epoch: int, **keys) -> Schedule:
    """The schedule of a trainer group at the schema's defaults but for `keys`."""
    return Schedule.of(TrainerConfig(epochs=epochs, **keys), batches_per_epoch)


class Asked(NamedTuple):
    kind: str  # "step": after optimizer step n; "epoch": at the end of epoch n (0-based)
    n: int
    evaluate: bool
    save: bool
    at: tuple[int, int, int]  # (step, epoch, batches_done) a launch resumed from this save starts at


def walk(s: Schedule, total_steps: int, start: tuple[int, int, int] = (0, 0, 0)) -> list[Asked]:
    """What a run of `total_steps` optimizer steps asks the schedule from (step, epoch, batches_done) on,
    in the Trainer's order: after each step, then at each epoch's end."""
    step, epoch, batches = start
    asked = []
    # (batches > 0 at the end: resumed from the save that max_steps made mid-epoch)
    while epoch < s.epochs and (step < total_steps or batches > 0):
        while step < total_steps and not s.epoch_exhausted(batches):
            step, batches = step + 1, batches + s.grad_accum
            asked.append(Asked("step", step, s.evaluate_after_step(step),
                               s.checkpoint_after_step(step, batches, step >= total_steps), (step, epoch, batches)))
        asked.append(Asked("epoch", epoch, s.evaluate_at_epoch_end(epoch, step >= total_steps),
                           s.checkpoint_at_epoch_end(batches), (step, epoch + 1, 0)))
        epoch, batches = epoch + 1, 0
    return asked


def where(asked: list[Asked], what: str) -> list[tuple[str, int]]:
    return [(a.kind, a.n) for a in asked if getattr(a, what)]


# 11 micro-batches an epoch, 2 a step: 5 steps an epoch, one batch left over
THREE_EPOCHS = schedule(epochs=3, batches_per_epoch=11, grad_accum=2, eval_every_epochs=1)


def test_an_epoch_ends_where_too_few_batches_are_left_for_another_step():
    assert [THREE_EPOCHS.epoch_exhausted(b) for b in (0, 8, 9, 10, 11)] == [False, False, False, True, True]
    assert [a.n for a in walk(THREE_EPOCHS, 15) if a.kind == "step"] == list(range(1, 16))
    assert [a.n for a in walk(THREE_EPOCHS, 15) if a.kind == "epoch"] == [0, 1, 2]


def test_evaluations_every_n_epochs_and_after_the_last():
    every_2 = schedule(epochs=5, batches_per_epoch=4, eval_every_epochs=2)
    assert where(walk(every_2, 20), "evaluate") == [("epoch", 1), ("epoch", 3), ("epoch", 4)]
    only_end = schedule(epochs=5, batches_per_epoch=4, eval_every_epochs=0)
    assert where(walk(only_end, 20), "evaluate") == [("epoch", 4)]
    assert where(walk(THREE_EPOCHS, 15), "evaluate") == [("epoch", 0), ("epoch", 1), ("epoch", 2)]


def test_evaluations_every_n_steps_besides_the_epoch_ends():
    s = schedule(epochs=2, batches_per_epoch=5, eval_every_epochs=0, eval_every_steps=4)
    assert where(walk(s, 10), "evaluate") == [("step", 4), ("step", 8), ("epoch", 1)]
    assert [s.evaluate_after_step(n) for n in (3, 4, 12)] == [False, True, True]
    assert not any(schedule(2, 5).evaluate_after_step(n) for n in range(1, 11))  # 0: never between epoch ends


@pytest.mark.parametrize("eval_every_epochs", [0, 1, 4])
def test_the_last_step_is_always_evaluated_also_where_max_steps_cuts_an_epoch(eval_every_epochs):
    s = schedule(epochs=4, batches_per_epoch=10, grad_accum=2, eval_every_epochs=eval_every_epochs,
                 eval_every_steps=3)
    asked = walk(s, 7)  # max_steps=7: 2 steps into the second epoch
    assert asked[-1] == Asked("epoch", 1, True, False, (7, 2, 0))  # evaluated, not saved again
    assert asked[-2] == Asked("step", 7, False, True, (7, 1, 4))  # saved after the step: the epoch goes on later
    assert s.evaluate_at_epoch_end(1, done=True) and s.evaluate_at_epoch_end(3, done=False)


def test_logging_every_n_steps():
    s = schedule(epochs=1, batches_per_epoch=20, log_every=4)
    assert [n for n in range(1, 21) if s.log_after_step(n)] == [4, 8, 12, 16, 20]


def test_checkpoints_every_n_steps_and_at_each_epochs_end_never_at_its_last_step():
    s = schedule(epochs=3, batches_per_epoch=11, grad_accum=2, ckpt_every_steps=5)
    # steps 5, 10, 15 are their epochs' last: the epoch-end save follows each, one save apiece
    assert where(walk(s, 15), "save") == [("epoch", 0), ("epoch", 1), ("epoch", 2)]
    s = schedule(epochs=3, batches_per_epoch=11, grad_accum=2, ckpt_every_steps=3)
    assert where(walk(s, 15), "save") == [("step", 3), ("epoch", 0), ("step", 6), ("step", 9), ("epoch", 1),
                                          ("step", 12), ("epoch", 2)]
    assert where(walk(schedule(epochs=3, batches_per_epoch=11, grad_accum=2), 15), "save") == \
        [("epoch", 0), ("epoch", 1), ("epoch", 2)]  # 0: at the epoch ends only


def test_a_checkpoint_where_max_steps_stops_mid_epoch_and_none_where_it_stops_at_an_epochs_end():
    s = schedule(epochs=3, batches_per_epoch=11, grad_accum=2, ckpt_every_steps=4)
    assert where(walk(s, 7), "save") == [("step", 4), ("epoch", 0), ("step", 7)]
    assert where(walk(s, 10), "save") == [("step", 4), ("epoch", 0), ("step", 8), ("epoch", 1)]


@pytest.mark.parametrize("s", [
    schedule(epochs=3, batches_per_epoch=11, grad_accum=2, eval_every_epochs=2, eval_every_steps=4,
             ckpt_every_steps=3),
    schedule(epochs=4, batches_per_epoch=6, eval_every_epochs=0, eval_every_steps=5, ckpt_every_steps=4),
], ids=["grad_accum", "plain"])
def test_a_resumed_run_gets_the_same_answers_from_its_step_on_as_one_that_never_stopped(s):
    total = s.epochs * (s.batches_per_epoch // s.grad_accum)
    whole = walk(s, total)
    saves = [i for i, a in enumerate(whole) if a.save]
    assert any(whole[i].kind == "step" and whole[i].at[2] > 0 for i in saves)  # some of them mid-epoch
    for i in saves:
        resumed = schedule(**dataclasses.asdict(s))  # built afresh by the resumed launch
        assert walk(resumed, total, start=whole[i].at) == whole[i + 1:], whole[i]


def test_a_run_cut_by_max_steps_and_resumed_without_it_goes_on_as_an_uncut_run():
    s = schedule(epochs=3, batches_per_epoch=11, grad_accum=2, eval_every_steps=4, ckpt_every_steps=6)
    cut = walk(s, 7)
    assert cut[-2].save and cut[-2].at == (7, 1, 4)  # the save that max_steps=7 made, mid-epoch
    uncut = walk(s, 15)
    after_7 = next(i for i, a in enumerate(uncut) if (a.kind, a.n) == ("step", 7))
    assert walk(s, 15, start=cut[-2].at) == uncut[after_7 + 1:]


def test_the_schedule_is_built_from_the_trainer_group(compose_train):
    t = compose_train(["trainer.epochs=3", "trainer.grad_accum=2", "trainer.log_every=7", "trainer.eval_every_epochs=2",
                       "trainer.eval_every_steps=5", "trainer.ckpt_every_steps=4"]).trainer
    assert Schedule.of(t, 11) == schedule(epochs=3, batches_per_epoch=11, grad_accum=2, log_every=7,
                                          eval_every_epochs=2, eval_every_steps=5, ckpt_every_steps=4)
