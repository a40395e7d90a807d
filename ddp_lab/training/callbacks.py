"""What happens around a step, on one list of step callbacks with named hook points.

The Trainer's loop calls, for every optimizer step, in this order:

    step_start(tr, micro)        before the first forward (micro: the step's micro-batches)
    batch_done(tr, loss, out, y) after each micro-batch's forward and backward
    synced(tr)                   the gradients synced and clipped (tr.grad_norm), before the optimizer step
    step_end(tr)                 after the optimizer step, tr.step counted: logging, evaluation,
                                 checkpoint, then faults and preemption, in the list's order

A callback observes: it defines the hooks it needs (the others are the base's no-ops), and no hook
returns anything the step uses. The list calls each callback that defines a hook, in the order the
builder listed them (training/builder.py). When to log, evaluate and save is the schedule's answer
(training/schedule.py). A fault that changes the step (a NaN loss, a skipped gradient sync) is built
into the loss and the sync by the builder; its callback only slows the step down or fires after it.
"""
from __future__ import annotations

from ddp_lab.guards.faults import Fault
from ddp_lab.telemetry import position

HOOKS = ("step_start", "batch_done", "synced", "step_end")


class StepCallback:
    """The hook points, all no-ops: a callback overrides those it needs."""

    def step_start(self, tr, micro: list) -> None:
        pass

    def batch_done(self, tr, loss, out, y) -> None:
        pass

    def synced(self, tr) -> None:
        pass

    def step_end(self, tr) -> None:
        pass


class Callbacks:
    """The builder's list of callbacks; each hook point calls only the callbacks that define it."""

    def __init__(self, callbacks: list[StepCallback]):
        self.callbacks = list(callbacks)
        self._at = {h: [c for c in self.callbacks if getattr(type(c), h) is not getattr(StepCallback, h)]
                    for h in HOOKS}

    def __iter__(self):
        return iter(self.callbacks)

    def step_start(self, tr, micro: list) -> None:
        for c in self._at["step_start"]:
            c.step_start(tr, micro)

    def batch_done(self, tr, loss, out, y) -> None:
        for c in self._at["batch_done"]:
            c.batch_done(tr, loss, out, y)

    def synced(self, tr) -> None:
        for c in self._at["synced"]:
            c.synced(tr)

    def step_end(self, tr) -> None:
        for c in self._at["step_end"]:
            c.step_end(tr)


class PositionMarks(StepCallback):
    """Where the training thread is, for the watchdog and stall reports (telemetry/position.py)."""

    def step_start(self, tr, micro: list) -> None:
        position.at_step(tr.step + 1)
        # a compiled model's first step in this process builds its kernels
        position.phase("compile" if tr.compiled and not tr.stepped else "forward/backward")

    def synced(self, tr) -> None:
        position.phase("optimizer step")

    def step_end(self, tr) -> None:
        position.phase("logging")


class Measure(StepCallback):
    """The step's one observer (telemetry/step_measure.py: trainer.measure=full|light|off)."""

    def __init__(self, measure):
        self.measure = measure

    def step_start(self, tr, micro: list) -> None:
        tr.target.start()  # the clock of a run to a target runs while steps do
        self.measure.step_starts(sum(len(y) for _, y in micro))

    def batch_done(self, tr, loss, out, y) -> None:
        self.measure.batch_done(loss, out, y)

    def synced(self, tr) -> None:
        self.measure.synced()

    def step_end(self, tr) -> None:
        self.measure.step_done()


class LossCheck(StepCallback):
    """A NaN or exploding loss stops the run (guards/divergence.py)."""

    def synced(self, tr) -> None:
        tr.loss_watch.observe(tr.last_loss, tr.step + 1, tr.grad_norm)


class LogWhenDue(StepCallback):
    """The step's loss, learning rate and straggler window every trainer.log_every steps."""

    def step_end(self, tr) -> None:
        if tr.schedule.log_after_step(tr.step):
            tr.log.scalars({"loss/train_step": tr.last_loss.item(), "lr": tr.scheduler.get_last_lr()[0],
                            **tr.measure.log_step(), **tr.sync.scalars()}, tr.step)


class EvaluateWhenDue(StepCallback):
    """trainer.eval_every_steps (and a run to a target, judged there): evaluate between steps."""

    def step_end(self, tr) -> None:
        if tr.schedule.evaluate_after_step(tr.step):
            tr.log.scalars(tr.evaluate_now(), tr.step)


class CheckpointWhenDue(StepCallback):
    """trainer.ckpt_every_steps and where the run ends mid-epoch: save (checkpoint/checkpointer.py;
    the epoch-end save is the Trainer's)."""

    def step_end(self, tr) -> None:
        if tr.schedule.checkpoint_after_step(tr.step, tr.batches_done, tr.done):
            tr.save_checkpoint()


class StopWhenAsked(StepCallback):
    """SIGTERM/SIGINT: every rank stops at the same step, saves and exits (guards/preemption.py)."""

    def __init__(self, preemption):
        self.preemption = preemption

    def step_end(self, tr) -> None:
        if self.preemption.stop_here(tr.step) and not tr.done:
            tr.save_and_stop()


class FaultInjection(StepCallback):
    """DDP_LAB_FAULT on its rank (guards/faults.py), as the steps see it: the sleep it adds, the failure
    it fires after a step or on entering a phase (position.on_phase). (Its NaN loss and skipped
    gradient sync are built into the loss and the sync: training/builder.py.) Listed after the
    checkpoint, before preemption."""

    def __init__(self, fault: Fault):
        self.fault, self.rank = fault, fault.rank
        if fault.phase is not None:
            position.on_phase(lambda name: fault.entering(fault.rank, name, position.HERE.step))

    def step_start(self, tr, micro: list) -> None:  # after the measure's: the sleep counts as compute
        self.fault.slow_down(self.rank, tr.step + 1, tr.measure.last_compute)

    def step_end(self, tr) -> None:  # after the step's logging, evaluation and checkpoint
        self.fault.after_step(self.rank, tr.step)
