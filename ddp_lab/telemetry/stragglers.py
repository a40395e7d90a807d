"""Stragglers: the rank whose computing makes every other rank wait.

The gradient sync waits for the slowest rank, so every rank's step takes
as long as the slowest one's: a slow rank is invisible in step times. It
shows in two other times, which each rank measures every step:

* compute: from the step's start until its last gradient is ready (the
  forward and backward passes, found with a hook on every parameter that
  fires when its gradient has been accumulated: the same under DDP, whose
  allreduces overlap the backward, as after it);
* sync wait: from then until the gradient sync is done. A fast rank waits
  here for the slow one; the slow one hardly waits at all.

Every `trainer.log_every` steps the ranks gather their averages (one small
all-gather), and rank 0 logs `perf/compute_ms/rank<N>`,
`perf/sync_wait_ms/rank<N>` and `perf/straggler_skew`: the slowest rank's
compute over the median of the others'. Over the whole run, a rank that
computed at least `trainer.straggler_threshold` times as long as the
median of the others is named in summary.json (`straggler`) and warned of.
"""
from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")


def skew(compute_ms: list[float]) -> tuple[int, float]:
    """(slowest rank, its compute over the median of the other ranks'); (0, 1.0) alone.

    NaN where the others timed no compute: no step ran (a launch resumed at its
    last step), so there is nothing to compare.
    """
    if len(compute_ms) < 2:
        return 0, 1.0
    slowest = max(range(len(compute_ms)), key=compute_ms.__getitem__)
    others = statistics.median(c for r, c in enumerate(compute_ms) if r != slowest)
    return slowest, compute_ms[slowest] / others if others > 0 else float("nan")


class StepTimer:
    """This rank's compute and sync-wait times per step (see the module docstring).

    On CUDA the hooks fire when kernels are queued, not done, so the three
    moments are CUDA events, read at report time: no host sync in the step.
    An event recorded at every gradient costs the host more than the rest of
    a small model's step does, so from the second step on only the gradient
    that came last in the first one records it (the same order every step).
    """

    def __init__(self, model: nn.Module, env: DistEnv):
        self.env = env
        self.cuda = env.device.type == "cuda"
        self.grads_ready = 0.0
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self.window = torch.zeros(3, dtype=torch.float64)  # compute s, wait s, steps since report
        self.run = torch.zeros(3, dtype=torch.float64)  # the same over the whole run
        self._start = 0.0
        self._events: list[torch.cuda.Event] = []  # CUDA: this step's start, grads ready, synced
        self._unread: list[list[torch.cuda.Event]] = []  # CUDA: steps not yet added up
        self.last_compute = 0.0  # seconds, the last step's (on CUDA: the last one read)
        # the parameter whose gradient came last, this step's and the first's, by id: held here, a parameter
        # closed a cycle through its own hooks that the collector missed (fsdp's mesh and group outlived teardown)
        self._latest = self._last = None

    def _grad_ready(self, param) -> None:
        if not self.cuda:
            self.grads_ready = time.perf_counter()
        elif self._events and (self._last is None or id(param) == self._last):
            self._events[1].record()  # each gradient (the first step) records it again: the last one stays
        self._latest = id(param)

    def start_step(self) -> None:
        if self.cuda:
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            self._events[0].record()
            self._events[1].record()  # a step without gradients: ready at once
        else:
            self._start = self.grads_ready = time.perf_counter()

    def synced(self) -> None:
        """The gradient sync of this step is done (before the optimizer step)."""
        if self.cuda:
            self._events[2].record()
            self._unread.append(self._events)
            if self._last is None:
                self._last = self._latest
            return
        self._add(self.grads_ready - self._start, time.perf_counter() - self.grads_ready)

    def _add(self, compute: float, wait: float) -> None:
        self.last_compute = compute
        step = torch.tensor([compute, wait, 1.0], dtype=torch.float64)
        self.window += step
        self.run += step

    def _read_events(self) -> None:
        for start, ready, synced in self._unread:
            synced.synchronize()
            self._add(start.elapsed_time(ready) / 1000, ready.elapsed_time(synced) / 1000)
        self._unread.clear()

    def gather(self, totals: torch.Tensor) -> list[tuple[float, float]]:
        """Every rank's (compute ms, sync wait ms) per step over `totals` (one all-gather)."""
        mine = totals.to(self.env.device)
        parts = [mine]
        if self.env.distributed:
            parts = [torch.empty_like(mine) for _ in range(self.env.world_size)]
            with position.collective("straggler report"):
                dist.all_gather(parts, mine)
        out = []
        for p in parts:
            compute, wait, steps = p.tolist()
            out.append((1000 * compute / max(steps, 1), 1000 * wait / max(steps, 1)))
        return out

    def report(self) -> dict[str, float]:
        """The window's TensorBoard scalars (every rank calls this at the same step)."""
        self._read_events()
        per_rank = self.gather(self.window)
        self.window.zero_()
        scalars = {}
        for r, (compute, wait) in enumerate(per_rank):
            scalars[f"perf/compute_ms/rank{r}"] = compute
            scalars[f"perf/sync_wait_ms/rank{r}"] = wait
        scalars["perf/straggler_skew"] = skew([c for c, _ in per_rank])[1]
        return scalars

    def straggler(self, threshold: float) -> dict | None:
        """{"rank", "slowdown"} of the run's straggler, or None (a collective: every rank)."""
        self._read_events()
        per_rank = self.gather(self.run)
        rank, slowdown = skew([c for c, _ in per_rank])
        if not slowdown >= threshold:  # NaN too: nothing measured in this launch
            return None
        if self.env.is_main:
            log.warning("straggler: rank %d computed %.2fx as long per step as the median of the "
                        "other ranks (%.1f against %.1f ms); every rank waited for it", rank,
                        slowdown, per_rank[rank][0],
                        statistics.median(c for r, (c, _) in enumerate(per_rank) if r != rank))
        return {"rank": rank, "slowdown": round(slowdown, 3)}
