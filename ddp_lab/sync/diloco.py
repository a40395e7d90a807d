"""sync.mode=diloco: H inner steps per rank, then an outer Nesterov step on the ranks' mean change.

DiLoCo (Douillard et al., 2023, "Distributed Low-Communication Training of
Language Models"): each rank trains on its own with the inner optimizer
(`optim`, AdamW in the paper) for H = `sync.every` steps. Then the ranks
average their change since the last synchronisation, the outer gradient
(anchor - weights), and an outer SGD with Nesterov momentum
(`sync.outer_lr`, `sync.outer_momentum`) takes one step from the anchor
with it; every rank continues from the result, which is the new anchor.

    every H steps:  delta   = mean over ranks of (anchor - weights)   one all-reduce
                    anchor <- outer SGD step on anchor with gradient delta
                    weights <- anchor

With H = 1, outer lr 1 and no momentum this is the mean of the ranks'
weights after one step each, that is DDP for a plain SGD inner optimizer
(tests/sync/test_periodic.py). `sync.compress=bf16|fp16` sends the outer
gradient in 16 bits, `int8|int4` in 8 or 4 (ddp_lab/collectives/quantized.py).
The anchor and the outer momentum are the same on every rank (checkpointed
once); the inner weights and optimizer state are each rank's own (checkpointed
per rank). Floating buffers (BatchNorm's statistics) are averaged, never
rounded, at each synchronisation and kept with the anchor. An evaluation
scores the anchor with the anchor's buffers, and every rank gets its own
weights and buffers back after.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.sync.local_sgd import LocalSGDSync, average_into, kept


class DiLoCoSync(LocalSGDSync):

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg, start=0)  # no synchronous start: every step is local
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.anchor = [p.detach().clone() for p in self.params]  # the last synchronised weights
        self.anchor_buffers = [b.detach().clone() for b in self.buffers]  # and buffers (their mean)
        m = cfg.outer_momentum
        self.outer = torch.optim.SGD(self.anchor, lr=cfg.outer_lr, momentum=m, nesterov=m > 0)

    @torch.no_grad()
    def synchronise(self) -> None:
        outer_grad = [a - p for a, p in zip(self.anchor, self.params)]  # how far this rank moved
        average_into(outer_grad, self._average)  # (16, 8 or 4 bits on the wire with sync.compress)
        for a, g in zip(self.anchor, outer_grad):
            a.grad = g
        self.outer.step()
        for p, a in zip(self.params, self.anchor):
            p.copy_(a)
        if self.buffers:  # BatchNorm's statistics are averaged as they are, never rounded
            average_into(self.buffers, self._average_exact)
            for a, b in zip(self.anchor_buffers, self.buffers):
                a.copy_(b)

    @contextlib.contextmanager
    def consensus(self):
        """The anchor and its buffers (the model every rank agrees on), for an evaluation; each
        rank's own weights and buffers are back after it."""
        if self.synced_at(self.step):
            yield
            return
        with kept(self.params + self.buffers):
            with torch.no_grad():
                for t, a in zip(self.params + self.buffers, self.anchor + self.anchor_buffers):
                    t.copy_(a)
            yield

    def state_dict(self) -> dict:
        return {"step": self.step, "anchor": [a.detach().clone() for a in self.anchor],
                "anchor_buffers": [a.detach().clone() for a in self.anchor_buffers],
                "outer": self.outer.state_dict()}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        super().load_state_dict(shared, own)
        if "anchor" in shared:
            with torch.no_grad():
                for a, saved in zip(self.anchor + self.anchor_buffers,
                                    shared["anchor"] + shared.get("anchor_buffers", [])):
                    a.copy_(saved)
            self.outer.load_state_dict(shared["outer"])

    def describe(self) -> str:
        c = self.cfg.compress
        return (f"diloco/{self.cfg.algo}(every {self.every}, outer lr {self.cfg.outer_lr:g}, "
                f"momentum {self.cfg.outer_momentum:g})" + ("" if c == "none" else f"+{c}"))
