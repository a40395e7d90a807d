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

sync.overlap=TAU (Streaming DiLoCo, Douillard et al. 2025): the outer
gradient's all-reduce starts at the synchronisation and the ranks go on with
their inner steps; TAU steps later they wait for it, the outer step moves the
anchor, and each rank mixes it into the weights it has reached since:
weights <- mix * weights + (1 - mix) * anchor (sync.overlap_mix; 0: replaced).
With TAU=0 nothing changes: the code path is the one above. An evaluation
scores the anchor; a checkpoint taken while an all-reduce travels keeps what
this rank sent, and a resumed run sends it again, so it resumes bit for bit. Under
sync.compress=int8|int4 the quantized mean's all-to-all travels in the background
and its all-gather (half the bytes) runs when the outer step lands.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.collectives.quantized import start_quantized_mean
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import COMPRESS_DTYPES, QUANTIZED
from ddp_lab.sync.local_sgd import LocalSGDSync, average_into, kept
from ddp_lab.telemetry import position


class InFlight(NamedTuple):
    """sync.overlap: an outer gradient's all-reduce on its way (work and wire None: resumed, not resent yet)."""
    work: object
    wire: torch.Tensor | None  # reduced in place: the mean once the work is done
    outer_grad: torch.Tensor  # what this rank sent (checkpointed)
    step: int  # when it was sent


class DiLoCoSync(LocalSGDSync):

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg, start=0)  # no synchronous start: every step is local
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.anchor = [p.detach().clone() for p in self.params]  # the last synchronised weights
        self.anchor_buffers = [b.detach().clone() for b in self.buffers]  # and buffers (their mean)
        m = cfg.outer_momentum
        self.outer = torch.optim.SGD(self.anchor, lr=cfg.outer_lr, momentum=m, nesterov=m > 0)
        self.overlap, self.mix = cfg.overlap, cfg.overlap_mix
        self.sent: InFlight | None = None

    # ------------------------------------------------------------ sync.overlap > 0
    def after_step(self, step: int) -> None:
        if not self.overlap:
            return super().after_step(step)
        self.step = step
        with position.collective("weight sync"), self._timed():
            if self.sent is not None and step == self.sent.step + self.overlap:
                self._land(self.mix)
            if step % self.every == 0:
                with torch.no_grad():
                    self._send(torch.cat([(a - p).reshape(-1) for a, p in zip(self.anchor, self.params)]), step)

    def _send(self, outer_grad: torch.Tensor, step: int) -> None:
        """Start the all-reduce of this rank's outer gradient (flat), in sync.compress's dtype (divided
        first, as _average does: a 16-bit sum cannot overflow), or its quantized mean (int8, int4: the
        all-to-all under way, the all-gather when it lands)."""
        if self.cfg.compress in QUANTIZED:
            wire = outer_grad.to(torch.float32, copy=True)  # (outer_grad kept as it was sent)
            pending, sent = start_quantized_mean(wire, self.cfg.compress)
            self.count(sent, 2)  # an all-to-all, then an all-gather when it lands
            self.sent = InFlight(pending, wire, outer_grad, step)
            return
        dtype = COMPRESS_DTYPES.get(self.cfg.compress) or outer_grad.dtype
        wire = outer_grad.to(dtype, copy=True).div_(self.env.world_size)  # (outer_grad kept as it was sent)
        self.count(wire.numel() * wire.element_size())
        self.sent = InFlight(dist.all_reduce(wire, async_op=True), wire, outer_grad, step)

    @torch.no_grad()
    def _land(self, mix: float) -> None:
        """Wait for the outer gradient's all-reduce, step the anchor, mix it into the weights. (Resumed
        while it travelled: every rank sends again what it sent, and the sum is the same to the bit.)"""
        if self.sent.work is None:
            self._send(self.sent.outer_grad, self.sent.step)
        self.sent.work.wait()
        mean, offset = self.sent.wire.float(), 0
        self.sent = None
        for a in self.anchor:
            a.grad = mean[offset:offset + a.numel()].view_as(a).to(a.dtype)
            offset += a.numel()
        self.outer.step()
        for p, a in zip(self.params, self.anchor):
            p.mul_(mix).add_(a, alpha=1 - mix)
        self._average_buffers()

    def finish(self, step: int) -> None:
        if not self.overlap:
            return super().finish(step)
        with position.collective("weight sync"):
            if self.sent is not None:  # the last outer step lands; every rank ends on the anchor
                self._land(0.0)
            elif step % self.every:
                self.synchronise()

    @torch.no_grad()
    def synchronise(self) -> None:
        outer_grad = [a - p for a, p in zip(self.anchor, self.params)]  # how far this rank moved
        average_into(outer_grad, self._average)  # (16, 8 or 4 bits on the wire with sync.compress)
        for a, g in zip(self.anchor, outer_grad):
            a.grad = g
        self.outer.step()
        for p, a in zip(self.params, self.anchor):
            p.copy_(a)
        self._average_buffers()

    def _average_buffers(self) -> None:
        """BatchNorm's statistics averaged as they are (never rounded by sync.compress), kept with the anchor."""
        if self.buffers:
            average_into(self.buffers, self._average_exact)
            for a, b in zip(self.anchor_buffers, self.buffers):
                a.copy_(b)

    @contextlib.contextmanager
    def consensus(self):
        """The anchor and its buffers (the model every rank agrees on), for an evaluation; each
        rank's own weights and buffers are back after it."""
        if self.synced_at(self.step) and not self.overlap:
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
                "outer": self.outer.state_dict(), "sent_at": self.sent.step if self.sent else None}

    def own_state_dict(self) -> dict:
        """overlap: what this rank sent in the all-reduce still travelling (sent again on resume)."""
        return {"sent": self.sent.outer_grad.clone()} if self.sent else {}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        super().load_state_dict(shared, own)
        if "anchor" in shared:
            with torch.no_grad():
                for a, saved in zip(self.anchor + self.anchor_buffers,
                                    shared["anchor"] + shared.get("anchor_buffers", [])):
                    a.copy_(saved)
            self.outer.load_state_dict(shared["outer"])
        if shared.get("sent_at") is not None and own and "sent" in own:  # (another world size: dropped)
            self.sent = InFlight(None, None, own["sent"], shared["sent_at"])

    def describe(self) -> str:
        c = self.cfg.compress
        late = f", overlap {self.overlap} mix {self.mix:g}" if self.overlap else ""
        return (f"diloco/{self.cfg.algo}(every {self.every}, outer lr {self.cfg.outer_lr:g}, "
                f"momentum {self.cfg.outer_momentum:g}{late})" + ("" if c == "none" else f"+{c}"))
