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
for TAU//2 steps, then its all-gather (the other half of the bytes) for the rest
(with TAU=1 the all-gather runs when the outer step lands).

sync.fragments=F (Streaming DiLoCo's fragments): the parameters, in the model's
order, are cut into F runs of about equal size; fragment f synchronises every H
steps as above, but at step f*H//F of each round, so each sync sends 1/F of the
outer gradient and the link's peak load falls F-fold. With sync.overlap=0 a
fragment's outer step lands at once and its weights become its anchor.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.collectives.quantized import start_quantized_mean
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.every_step.averaging import COMPRESS_DTYPES
from ddp_lab.sync.periodic.local_sgd import LocalSGDSync, average_into, kept
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
        self.fragments = fragment_bounds([p.numel() for p in self.params], cfg.fragments)
        self.streaming = bool(self.overlap) or len(self.fragments) > 1
        self.sent: list[InFlight | None] = [None] * len(self.fragments)  # each fragment's, on its way

    # ------------------------------------------------------------ sync.overlap > 0 or sync.fragments > 1
    def due(self, f: int, step: int) -> bool:
        """Whether fragment f sends its outer gradient after optimizer step `step` (its offset in the round)."""
        return step % self.every == f * self.every // len(self.fragments)

    def after_step(self, step: int) -> None:
        if not self.streaming:
            return super().after_step(step)
        self.step = step
        with position.collective("weight sync"), self._timed():
            for f, sent in enumerate(self.sent):
                if sent is not None and step == sent.step + self.overlap:
                    self._land(f, self.mix)
                elif sent is not None and step == sent.step + self.overlap // 2 and hasattr(sent.work, "advance"):
                    sent.work.advance()  # int8, int4: halfway, the all-gather starts in the background
            for f in range(len(self.fragments)):
                if self.due(f, step):
                    self._send_fragment(f, step)
                    if not self.overlap:  # it lands at once: the fragment's weights become its anchor
                        self._land(f, 0.0)

    @torch.no_grad()
    def _send_fragment(self, f: int, step: int) -> None:
        lo, hi = self.fragments[f]
        self._send(f, torch.cat([(a - p).reshape(-1) for a, p in zip(self.anchor[lo:hi], self.params[lo:hi])]), step)

    def _send(self, f: int, outer_grad: torch.Tensor, step: int) -> None:
        """Start the all-reduce of this rank's outer gradient (flat), in sync.compress's dtype (divided
        first, as _average does: a 16-bit sum cannot overflow), or its quantized mean (int8, int4: the
        all-to-all under way, the all-gather when it lands)."""
        if self.cfg.compress in QUANTIZED:
            wire = outer_grad.to(torch.float32, copy=True)  # (outer_grad kept as it was sent)
            pending, sent = start_quantized_mean(wire, self.cfg.compress)
            self.count(sent, 2)  # an all-to-all, then an all-gather when it lands
            self.sent[f] = InFlight(pending, wire, outer_grad, step)
            return
        dtype = COMPRESS_DTYPES.get(self.cfg.compress) or outer_grad.dtype
        wire = outer_grad.to(dtype, copy=True).div_(self.env.world_size)  # (outer_grad kept as it was sent)
        self.count(wire.numel() * wire.element_size())
        self.sent[f] = InFlight(dist.all_reduce(wire, async_op=True), wire, outer_grad, step)

    @torch.no_grad()
    def _land(self, f: int, mix: float) -> None:
        """Wait for fragment f's outer gradient, step its anchor, mix it into its weights. (Resumed while
        it travelled: every rank sends again what it sent, and the sum is the same to the bit.)"""
        if self.sent[f].work is None:
            self._send(f, self.sent[f].outer_grad, self.sent[f].step)
        self.sent[f].work.wait()
        mean, offset = self.sent[f].wire.float(), 0
        self.sent[f] = None
        lo, hi = self.fragments[f]
        for a in self.anchor[lo:hi]:
            a.grad = mean[offset:offset + a.numel()].view_as(a).to(a.dtype)
            offset += a.numel()
        self.outer.step()  # (the other fragments' anchors have no gradient: SGD leaves them, and their momentum)
        for p, a in zip(self.params[lo:hi], self.anchor[lo:hi]):
            p.mul_(mix).add_(a, alpha=1 - mix)
            a.grad = None
        if f == 0:  # once a round
            self._average_buffers()

    def finish(self, step: int) -> None:
        if not self.streaming:
            return super().finish(step)
        with position.collective("weight sync"):
            if len(self.fragments) == 1 and self.sent[0] is None:
                if step % self.every:
                    self.synchronise()
                return
            for f, sent in enumerate(self.sent):  # every rank ends on the anchor
                if sent is None and not (self.due(f, step) and not self.overlap):
                    self._send_fragment(f, step)
                if self.sent[f] is not None:
                    self._land(f, 0.0)

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
        if self.synced_at(self.step) and not self.streaming:
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
                "outer": self.outer.state_dict(), "sent_at": [s.step if s else None for s in self.sent]}

    def own_state_dict(self) -> dict:
        """overlap: what this rank sent in the all-reduces still travelling, by fragment (sent again on resume)."""
        if not any(self.sent):
            return {}
        return {"sent": [s.outer_grad.clone() if s else None for s in self.sent]}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        super().load_state_dict(shared, own)
        if "anchor" in shared:
            with torch.no_grad():
                for a, saved in zip(self.anchor + self.anchor_buffers,
                                    shared["anchor"] + shared.get("anchor_buffers", [])):
                    a.copy_(saved)
            self.outer.load_state_dict(shared["outer"])
        sent_at, mine = shared.get("sent_at"), (own or {}).get("sent")
        if isinstance(sent_at, int):  # saved before fragments: one, the whole model
            sent_at, mine = [sent_at], None if mine is None else [mine]
        if sent_at is None or not any(s is not None for s in sent_at):
            return
        if len(sent_at) != len(self.fragments):
            raise ConfigError(f"the checkpoint was saved with sync.fragments={len(sent_at)} while an outer gradient "
                              f"travelled: resume with sync.fragments={len(sent_at)}")
        if mine is not None:  # (another world size: no file of this rank's; dropped)
            self.sent = [InFlight(None, None, g, at) if at is not None else None for at, g in zip(sent_at, mine)]

    def describe(self) -> str:
        c = self.cfg.compress
        late = f", overlap {self.overlap} mix {self.mix:g}" if self.overlap else ""
        late += f", fragments {len(self.fragments)}" if len(self.fragments) > 1 else ""
        return (f"diloco/{self.cfg.algo}(every {self.every}, outer lr {self.cfg.outer_lr:g}, "
                f"momentum {self.cfg.outer_momentum:g}{late})" + ("" if c == "none" else f"+{c}"))


def fragment_bounds(sizes: list[int], fragments: int) -> list[tuple[int, int]]:
    """[lo, hi) runs of the parameters (their element counts `sizes`, in order) cut into `fragments` of about
    equal size: fragment f begins at the first parameter where the running total reaches f/F of the whole
    (or where the parameters left are just enough for one each)."""
    if fragments > len(sizes):
        raise ConfigError(f"sync.fragments={fragments} is more than the model's {len(sizes)} trainable parameter "
                          f"tensors: use at most {len(sizes)}")
    total, cuts = sum(sizes), [0]
    for i in range(1, len(sizes)):
        left = fragments - len(cuts)
        if left and (sum(sizes[:i]) >= len(cuts) * total / fragments or len(sizes) - i == left):
            cuts.append(i)
    return list(zip(cuts, cuts[1:] + [len(sizes)]))
