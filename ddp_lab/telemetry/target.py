"""Training to a target: when to evaluate, whether a result reached the target, and how long it took.

`trainer.target_acc` (held-out accuracy, classification) and
`trainer.target_loss` (held-out loss, any task) stop the run at the first
evaluation that reaches them (or, with `trainer.stop_at_target=false`, only
note it: a race to a target that also compares the final figures); `trainer.eval_every_steps=N` evaluates every N
optimizer steps besides the epoch ends (training/schedule.py says when). MLPerf Training's measure of a
method is the wall time to such a target: steps to the target (what the
method does to learning) times the time a step takes (what it does to the
network).

The wall clock starts at the run's first step and runs through evaluations
(they are part of reaching the target) and checkpoints; a resumed run adds
the time of its earlier launches. Evaluation time is also kept on its own,
in all and up to the target (a time to target without evaluations is the
one minus the other), and so are the bytes handed to all-reduces up to the
target (what a strategy actually sent to get there: PowerSGD's plain steps
come first, so its average over a run is not its cost to the target).
Each evaluation's figures go to TensorBoard twice: against steps, and under
`by_time/` against milliseconds since the first step (TensorBoard's x axis
is a step count), so that curves of methods with different step times meet
on one time axis.
"""
from __future__ import annotations

import time

from ddp_lab.config import ConfigError


class TimeToTarget:
    def __init__(self, t, task_name: str):
        """t: the trainer group (target_acc, target_loss, stop_at_target)."""
        self.acc, self.loss = t.target_acc, t.target_loss
        self.stops = t.stop_at_target
        if self.acc > 0 and task_name != "classification":
            raise ConfigError(f"trainer.target_acc={self.acc} needs a classification task, and this data is "
                              f"{task_name}: set trainer.target_loss instead")
        self.carried_s = 0.0  # earlier launches' wall time
        # and what they sent (sync.counts() is this launch's)
        self.carried = {"wire_bytes": 0, "collectives": 0, "wire_bytes_across": 0, "collectives_across": 0}
        self.eval_s = 0.0
        self.reached: dict | None = None  # {"step", "seconds"} of the evaluation that reached it
        self._t0: float | None = None

    @property
    def stop(self) -> bool:
        """Whether the run ends here: its target reached, and trainer.stop_at_target."""
        return self.reached is not None and self.stops

    @property
    def set(self) -> bool:
        return self.acc > 0 or self.loss > 0

    def start(self) -> None:
        """At this launch's first step."""
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def elapsed_s(self) -> float:
        return self.carried_s + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def evaluated(self, metrics: dict, split: str, seconds: float, step: int, judged: bool = True,
                  sent: dict | None = None) -> bool:
        """Note an evaluation (its figures, `seconds` long) after step `step`, with what this launch sent
        so far (`sent`: sync.counts()); True if it reached the target (only the first one that did
        counts; none where not `judged`)."""
        self.eval_s += seconds
        if self.reached is not None or not self.set or not judged:
            return False
        acc, loss = metrics.get(f"acc/{split}"), metrics[f"loss/{split}"]
        if (self.acc > 0 and acc is not None and acc >= self.acc) or (0 < self.loss and loss <= self.loss):
            self.reached = {"step": step, "seconds": self.elapsed_s(), "eval_s": self.eval_s, **self._sent(sent)}
            return True
        return False

    def by_time(self, metrics: dict) -> tuple[dict, int]:
        """The figures under by_time/, and the x value: milliseconds since the first step."""
        return {f"by_time/{k.replace('/', '_')}": v for k, v in metrics.items()}, round(1000 * self.elapsed_s())

    def summary(self) -> dict:
        target = {"acc": self.acc} if self.acc > 0 else {"loss": self.loss} if self.loss > 0 else None
        r = self.reached
        return {"target": target, "target_reached": r is not None if target else None,
                "steps_to_target": r["step"] if r else None,
                "time_to_target_s": r["seconds"] if r else None,
                "eval_s_to_target": r.get("eval_s") if r else None,  # (None: reached before it was kept)
                "wire_bytes_to_target": r.get("wire_bytes") if r else None,
                "collectives_to_target": r.get("collectives") if r else None,  # (None: reached before they were)
                "wire_bytes_across_to_target": r.get("wire_bytes_across") if r else None,  # (sync.islands, HSDP)
                "collectives_across_to_target": r.get("collectives_across") if r else None,
                "train_s": self.elapsed_s(), "eval_s": self.eval_s}

    def _sent(self, sent: dict | None) -> dict[str, int]:
        """The run's bytes and collectives so far: earlier launches' and this one's (`sent`)."""
        return {k: v + (sent or {}).get(k, 0) for k, v in self.carried.items()}

    def state_dict(self, sent: dict | None = None) -> dict:
        """sent: what this launch sent so far (sync.counts())."""
        return {"elapsed_s": self.elapsed_s(), "eval_s": self.eval_s, "reached": self.reached, **self._sent(sent)}

    def load_state_dict(self, state: dict) -> None:
        self.carried_s, self.eval_s, self.reached = state["elapsed_s"], state["eval_s"], state["reached"]
        # (checkpoints from before bytes, or collectives, were kept: 0)
        self.carried = {k: state.get(k, 0) for k in self.carried}
