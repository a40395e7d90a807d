"""When a run logs, evaluates and saves: one schedule, asked by the Trainer and its step callbacks.

    after optimizer step s    log       every trainer.log_every steps
                              evaluate  every trainer.eval_every_steps steps (0: not between epoch ends)
                              save      every trainer.ckpt_every_steps steps, and where the run ends
                                        mid-epoch (trainer.max_steps, a target reached); never at an
                                        epoch's last step: the epoch-end save follows it
    at the end of epoch e     evaluate  every trainer.eval_every_epochs epochs, after the last epoch, and
                                        wherever the run ends: its last step is always evaluated
                              save      where the epoch ran out of batches (max_steps cut one short:
                                        saved after its step)

Every answer is a function of where the run is (its step, epoch and the epoch's batches done, whether it
is over), all checkpointed: a resumed run gets the same answers from its step on as one that never stopped.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    epochs: int
    batches_per_epoch: int  # a rank's micro-batches in an epoch
    grad_accum: int  # micro-batches per optimizer step
    log_every: int
    eval_every_epochs: int  # 0: only where the run ends
    eval_every_steps: int  # 0: only at epoch ends
    ckpt_every_steps: int  # 0: only at epoch ends and where the run ends

    @staticmethod
    def of(t, batches_per_epoch: int) -> Schedule:
        """From the trainer group, for a rank's shard of `batches_per_epoch` micro-batches."""
        return Schedule(t.epochs, batches_per_epoch, t.grad_accum, t.log_every, t.eval_every_epochs,
                        t.eval_every_steps, t.ckpt_every_steps)

    def epoch_exhausted(self, batches_done: int) -> bool:
        """Too few of the epoch's batches left for another optimizer step."""
        return batches_done + self.grad_accum > self.batches_per_epoch

    def log_after_step(self, step: int) -> bool:
        return step % self.log_every == 0

    def evaluate_after_step(self, step: int) -> bool:
        """Between epoch ends (and a run to a target judged there)."""
        return self.eval_every_steps > 0 and step % self.eval_every_steps == 0

    def evaluate_at_epoch_end(self, epoch: int, done: bool) -> bool:
        """At the end of epoch `epoch` (0-based); `done`: the run ends with it."""
        ended = epoch + 1
        return done or ended == self.epochs or (self.eval_every_epochs > 0 and ended % self.eval_every_epochs == 0)

    def checkpoint_after_step(self, step: int, batches_done: int, done: bool) -> bool:
        """After optimizer step `step`, `batches_done` of its epoch's batches done; `done`: the run ends here."""
        if self.epoch_exhausted(batches_done):
            return False
        return done or (self.ckpt_every_steps > 0 and step % self.ckpt_every_steps == 0)

    def checkpoint_at_epoch_end(self, batches_done: int) -> bool:
        """At an epoch's end, `batches_done` of its batches done."""
        return self.epoch_exhausted(batches_done)
