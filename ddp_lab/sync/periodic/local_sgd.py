"""sync=local_sgd: each rank takes its own steps; every `sync.every` steps the ranks average their weights.

Local SGD (Lin et al., ICLR 2020, "Don't use large mini-batches, use local
SGD") sends the weights once per H = `sync.every` steps instead of the
gradients every step: H times fewer bytes, at the price of ranks that drift
apart in between. Post-local SGD starts with `sync.local_sgd_start_step`
ordinary synchronous steps (gradients averaged every step, as sync=flat),
where the paper found the drift hurts most, and goes local after them.

torch's PeriodicModelAverager does the averaging with the builtin all-reduce
only; here it goes through `sync.algo` like every other strategy and counts
its bytes. With H = 1 and plain SGD this is DDP: averaging the weights after
a step of each rank's gradient is the step of the averaged gradient, since
the update is linear (tests/sync/test_periodic.py). Optimizer state (SGD's
momentum) stays per rank, as in the paper.

Between synchronisations the ranks' weights differ, so every rank's weights
and optimizer state go into its own checkpoint file (`caps.diverges`), an
evaluation scores the average of the ranks' weights (`consensus`), and the
run ends with a synchronisation (`finish`).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, SyncContext
from ddp_lab.sync.every_step.averaging import COMPRESS_DTYPES
from ddp_lab.sync.every_step.flat import FlatSync
from ddp_lab.sync.islands.layout import start_island_mean
from ddp_lab.sync.periodic.periodic_options import LocalSGDOptions, PeriodicOptions
from ddp_lab.telemetry import position


class LocalSGDSync(FlatSync):
    caps = Capabilities(diverges=True, grads_set_to_none=False)  # (flat's buffer kept)
    averages = "weights"  # (across islands: the trained tensors, this rank's shards of them under stage 3 or fsdp)

    def __init__(self, model: nn.Module, env: DistEnv, cfg: PeriodicOptions, ctx: SyncContext = NO_CONTEXT):
        # rank 0's weights everywhere; gradient buffers for synchronous steps (none across islands: env is
        # then rank i of every island, the islands' inner strategy averaging the gradients), in one buffer
        islands, trained = ctx.islands, ctx.trained
        super().__init__(model, env, cfg, gradients=islands is None, buffer_mb=0, overlap=False)
        self.islands = islands
        # sync.fault_tolerance=torchft: the islands present meet at each round's start and vote on its exchange
        self.replicas = islands.replicas if islands is not None else None
        self.every = cfg.every
        self.start = cfg.local_sgd_start_step if isinstance(cfg, LocalSGDOptions) else 0  # (diloco: no such start)
        self.step = 0  # optimizer steps taken, the run's count (checkpointed)
        # the trained tensors (a frozen one never changes), asked anew each time: `trained()`, where the island's
        # inner strategy shards them (sync.islands with zero stage 3 or fsdp: this rank's shards)
        mine = [p for p in model.parameters() if p.requires_grad]
        self._trained = trained or (lambda: mine)
        self.floating_buffers = [b for b in model.buffers() if b.is_floating_point()]

    @property
    def params(self) -> list[torch.Tensor]:
        """The trained tensors this rank synchronises: the model's parameters, or its shards of them."""
        return self._trained()

    @property
    def weights(self) -> list[torch.Tensor]:
        """What travels: the trained tensors and floating buffers (BatchNorm's statistics)."""
        return self.params + self.floating_buffers

    def synced_at(self, step: int) -> bool:
        """Whether every rank holds the same weights after optimizer step `step`."""
        return step <= self.start or (step - self.start) % self.every == 0

    def after_backward(self) -> None:
        if self.step < self.start:  # a synchronous step: average the gradients (flat)
            super().after_backward()

    def after_step(self, step: int) -> None:
        self.step = step
        if not self.synced_at(step):
            return
        if step > self.start:
            with position.collective("weight sync", own_timeout_s=self.across_s()), self._timed():
                self.synchronise()

    def across_s(self) -> float:
        """What the watchdog allows a sync beyond dist.timeout_s: across torchft islands (diloco's replicas),
        torchft's own timeouts end the wait first."""
        return self.replicas.exchange_s if self.replicas is not None else 0.0

    def synchronise(self) -> None:
        """Every rank's weights <- the mean of the ranks' weights; across torchft islands where the round commits
        (one an island was lost in leaves each island's weights as they were)."""
        average_into(self.weights, self._average, lambda: self.replicas is None or self.replicas.commit(self.step))

    def _average(self, flat: torch.Tensor) -> None:
        """flat <- its mean over the ranks; across islands, over the islands (this rank's chunk of it, then
        gathered inside the island: islands/layout.py)."""
        if self.islands is None:
            return super()._average(flat)
        self._start_island_mean(flat).wait()

    def outer_wire(self) -> str:
        """What crosses between islands: local_sgd's weights as they are (diloco's sync.compress)."""
        return "none"

    def _start_island_mean(self, flat: torch.Tensor, residual=None, generator: torch.Generator | None = None):
        """The mean over islands under way (int8, int4: rounded with `residual` or `generator`), its bytes counted;
        in diloco's sync.compress (local_sgd's weights cross as they are)."""
        compress = self.outer_wire()
        pending, across, calls, inside = start_island_mean(flat, self.islands, compress, COMPRESS_DTYPES.get(compress),
                                                           residual, generator)
        self.count(across, calls, across=True)
        if inside:
            self.count(inside)  # (the all-gather inside the island)
        return pending

    def finish(self, step: int) -> None:
        if not self.synced_at(step):
            with position.collective("weight sync", own_timeout_s=self.across_s()):
                self.synchronise()

    @contextlib.contextmanager
    def consensus(self):
        """The mean of the ranks' weights, for an evaluation; the local ones are back after.
        Its bytes are the evaluation's, not a training step's."""
        if self.synced_at(self.step):
            yield
            return
        with kept(self.weights):
            with position.collective("weight sync for evaluation"):
                with self.uncounted():  # (no vote across torchft islands: the weights are put back after)
                    average_into(self.weights, self._average)
            yield

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        self.step = shared.get("step", self.step)

    def describe(self) -> str:
        start = f", synchronous for {self.start}" if self.start else ""
        return f"local_sgd/{self.cfg.algo}(every {self.every}{start})"


@torch.no_grad()
def average_into(tensors: list[torch.Tensor], average, keep: Callable[[], bool] = lambda: True) -> None:
    """tensors <- the mean over ranks, through one flat buffer and `average` (in place on 1-D), if `keep()`."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    average(flat)
    if not keep():
        return
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()


@contextlib.contextmanager
def kept(tensors: list[torch.Tensor]):
    """Whatever the context does to `tensors`, they hold their values of before it after it."""
    saved = [t.detach().clone() for t in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, value in zip(tensors, saved):
                t.copy_(value)
