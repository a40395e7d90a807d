"""sync=diloco: H inner steps per rank, then an outer Nesterov step on the ranks' mean change.

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

sync.overlap_update=eager (after Kale, Douillard and Donchev 2025, "Eager updates for overlapped
communication and computation in DiLoCo"): instead of going on from its own weights and mixing the anchor
in when the mean lands (delayed, the default), a rank takes the outer step at once with a proxy of the mean
and goes on from that anchor; when the mean lands, the anchor takes the true step and each rank's weights
move by the difference between the true anchor and the proxy one (with a perfect proxy, blocking DiLoCo
without the wait). The proxy (sync.eager_proxy): local, this rank's own outer gradient, the default; or
paper, (own + M mean_last - own_last) / M over M workers, our adaptation of the paper's proxy to an overlap
shorter than a round. The paper overlaps a whole round (TAU = H, which sync.overlap < sync.every refuses),
where the others' last outer gradients are not applied yet; here they landed TAU steps after they were sent,
so that formula counts them twice until the correction. How far each falls behind blocking DiLoCo:
docs/bandwidth.md.

What lands is what is scored: an evaluation while an outer gradient travels waits for it and scores
the anchor as it will be once landed (the training goes on as if it had not waited). `finish` lands
what was sent at the last step at once, as blocking DiLoCo would, and what was sent before as training
would; then each fragment with steps taken since its send sends the rest of each rank's progress and
lands it, so that no step is dropped.

sync.fragments=F (Streaming DiLoCo's fragments): the parameters, in the model's
order, are cut into F runs of about equal size; fragment f synchronises every H
steps as above, but at step f*H//F of each round, so each sync sends 1/F of the
outer gradient and the link's peak load falls F-fold. With sync.overlap=0 a
fragment's outer step lands at once and its weights become its anchor.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.collectives.quantized import Residual, start_quantized_mean
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, SyncContext
from ddp_lab.sync.every_step.averaging import COMPRESS_DTYPES
from ddp_lab.sync.periodic.diloco_state import DiLoCoState
from ddp_lab.sync.periodic.fragments import fragment_bounds
from ddp_lab.sync.periodic.in_flight import LANDED, InFlight
from ddp_lab.sync.periodic.local_sgd import LocalSGDSync, average_into, kept
from ddp_lab.sync.periodic.periodic_options import DiLoCoOptions
from ddp_lab.telemetry import position


class DiLoCoSync(DiLoCoState, LocalSGDSync):

    def __init__(self, model: nn.Module, env: DistEnv, cfg: DiLoCoOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env, cfg, ctx)
        islands = ctx.islands
        self.buffers = self.floating_buffers
        # sharded inside islands, each rank's anchor and outer momentum are of its own shard: checkpointed per rank
        self.own_anchor = islands is not None and islands.sharded_inside
        self.anchor = [p.detach().clone() for p in self.params]  # the last synchronised weights
        self.anchor_buffers = [b.detach().clone() for b in self.buffers]  # and buffers (their mean)
        m = cfg.outer_momentum
        self.outer = torch.optim.SGD(self.anchor, lr=cfg.outer_lr, momentum=m, nesterov=m > 0)
        self.overlap, self.mix = cfg.overlap, cfg.overlap_mix
        self.eager = bool(self.overlap) and cfg.overlap_update == "eager"
        self.paper_proxy = self.eager and cfg.eager_proxy == "paper"  # (else: local)
        self.fragments = fragment_bounds([p.numel() for p in self.params], cfg.fragments)
        self.streaming = bool(self.overlap) or len(self.fragments) > 1
        self.sent: list[InFlight | None] = [None] * len(self.fragments)  # each fragment's, on its way
        # eager with the paper's proxy: each fragment's last landed mean and what this rank sent for it
        self.last: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.fragments)
        # int8, int4 with sync.rounding=feedback: what rounding left out, per fragment (each rank's own)
        self.rounding = cfg.rounding if cfg.compress in QUANTIZED else "nearest"
        self.residuals = [Residual() for _ in self.fragments] if self.rounding == "feedback" else None

    # ------------------------------------------------------------ sync.overlap > 0 or sync.fragments > 1
    def due(self, f: int, step: int) -> bool:
        """Whether fragment f sends its outer gradient after optimizer step `step` (its offset in the round)."""
        return step % self.every == f * self.every // len(self.fragments)

    def after_step(self, step: int) -> None:
        if not self.streaming:
            return super().after_step(step)
        self.step = step
        with position.collective("weight sync", own_timeout_s=self.across_s()), self._timed():
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
        self._send(f, self._outer_grad(f), step)
        if self.eager:
            self._take_proxy_step(f)

    def _send(self, f: int, outer_grad: torch.Tensor, step: int, proxy: torch.Tensor | None = None) -> None:
        """Start the all-reduce of this rank's outer gradient (flat), in sync.compress's dtype (divided
        first, as _average does: a 16-bit sum cannot overflow), or its quantized mean (int8, int4: the
        all-to-all under way, the all-gather when it lands); across islands, this rank's chunk of it."""
        if self.islands is not None or self.cfg.compress in QUANTIZED:
            wire = outer_grad.to(torch.float32, copy=True)  # (outer_grad kept as it was sent)
            r = self.residuals[f] if self.residuals else None
            before = Residual(r.sent, r.mean) if r else None  # (the send replaces r's tensors, never writes them)
            if self.islands is not None:
                pending = self._start_island_mean(wire, *self._rounding(f, step))
            else:
                pending, sent = start_quantized_mean(wire, self.cfg.compress, None, *self._rounding(f, step))
                self.count(sent, 2)  # an all-to-all, then an all-gather when it lands
            self.sent[f] = InFlight(pending, wire, outer_grad, step, proxy, before)
            return
        dtype = COMPRESS_DTYPES.get(self.cfg.compress) or outer_grad.dtype
        wire = outer_grad.to(dtype, copy=True).div_(self.env.world_size)
        self.count(wire.numel() * wire.element_size())
        self.sent[f] = InFlight(dist.all_reduce(wire, async_op=True), wire, outer_grad, step, proxy)

    def _rounding(self, f: int, step: int) -> tuple[Residual | None, torch.Generator | None]:
        """int8, int4: fragment f's error feedback, or stochastic rounding's noise for the send at `step`
        (seeded by the step, fragment and rank: a resumed run draws the same)."""
        if self.rounding == "stochastic":
            rank = dist.get_rank() if dist.is_initialized() else 0
            return None, torch.Generator().manual_seed(((step * 1009 + f) * 65537 + rank) % 2**62)
        return (self.residuals[f] if self.residuals else None), None

    def _mean(self, f: int) -> torch.Tensor:
        """Fragment f's mean outer gradient, waited for (once; what a resumed run sends again is not counted:
        its launch before counted it)."""
        sent = self.sent[f]
        if sent.work is None:
            with self.uncounted():
                self._send(f, sent.outer_grad, sent.step, sent.proxy)
            sent = self.sent[f]
        sent.work.wait()
        self.sent[f] = sent._replace(work=LANDED)
        return sent.wire.float()

    def _nesterov(self, f: int, delta: torch.Tensor) -> list[torch.Tensor]:
        """Fragment f's anchor after an outer step with `delta` (flat), computed apart: the outer optimizer,
        its momentum and the anchor are left as they are (torch's SGD, written out: tests/sync/test_diloco.py)."""
        lo, hi = self.fragments[f]
        lr, mu, out, offset = self.cfg.outer_lr, self.cfg.outer_momentum, [], 0
        for a in self.anchor[lo:hi]:
            g = delta[offset:offset + a.numel()].view_as(a).to(a.dtype)
            offset += a.numel()
            if mu:
                b = self.outer.state.get(a, {}).get("momentum_buffer")
                b = g.clone() if b is None else b * mu + g
                g = g + mu * b
            out.append(a - lr * g)
        return out

    @torch.no_grad()
    def _take_proxy_step(self, f: int) -> None:
        """Eager: this fragment's weights <- the anchor after an outer step with a proxy of the mean: this rank's
        own outer gradient (local), or the paper's (own + M mean_last - own_last) / M; the proxy anchor kept to
        correct by when the mean lands."""
        own, m = self.sent[f].outer_grad.float(), self.env.world_size
        proxy_grad = own
        if self.paper_proxy:
            proxy_grad = own / m if self.last[f] is None else self.last[f][0] + (own - self.last[f][1]) / m
        proxy = self._nesterov(f, proxy_grad)
        lo, hi = self.fragments[f]
        for p, a in zip(self.params[lo:hi], proxy):
            p.copy_(a)
        self.sent[f] = self.sent[f]._replace(proxy=torch.cat([a.reshape(-1) for a in proxy]))

    @torch.no_grad()
    def _land(self, f: int, mix: float) -> None:
        """Wait for fragment f's outer gradient, step its anchor, and bring it into its weights: mixed
        (delayed), or by the true anchor's difference from the proxy one (eager). (Resumed while it
        travelled: every rank sends again what it sent, and the sum is the same to the bit.)"""
        mean, sent = self._mean(f), self.sent[f]
        self.sent[f] = None
        buffers = self._buffers_mean() if f == 0 else None  # (once a round; across torchft islands the vote covers it)
        if self.replicas is not None and not self.replicas.commit(sent.step):
            if sent.proxy is not None:  # eager: the proxy's step undone, the steps since kept (the anchor stays)
                self._rebase(f, sent.proxy)
            return  # (an island lost in the exchange: no outer step, the next one spans both rounds)
        lo, hi = self.fragments[f]
        offset = 0
        for a in self.anchor[lo:hi]:
            a.grad = mean[offset:offset + a.numel()].view_as(a).to(a.dtype)
            offset += a.numel()
        self.outer.step()  # (the other fragments' anchors have no gradient: SGD leaves them, and their momentum)
        if sent.proxy is not None:  # eager: keep every step taken since, from the true anchor
            self._rebase(f, sent.proxy)
        else:
            for p, a in zip(self.params[lo:hi], self.anchor[lo:hi]):
                p.mul_(mix).add_(a, alpha=1 - mix)
        for a in self.anchor[lo:hi]:
            a.grad = None
        if self.paper_proxy:
            self.last[f] = (mean, sent.outer_grad.float())
        if buffers is not None:
            self._take_buffers(buffers, 0.0 if sent.proxy is not None else mix)

    @torch.no_grad()
    def _rebase(self, f: int, proxy: torch.Tensor) -> None:
        """Eager: fragment f's weights, which went on from the `proxy` anchor, moved onto the anchor as it now is
        (stepped with the mean, or where the exchange was not agreed across torchft islands, as it was), every
        inner step since kept."""
        lo, hi = self.fragments[f]
        offset = 0
        for p, a in zip(self.params[lo:hi], self.anchor[lo:hi]):
            p.add_(a - proxy[offset:offset + a.numel()].view_as(a))
            offset += a.numel()

    def quorum_due(self, step: int) -> bool:
        """Across torchft islands, where the islands present meet: once an exchange has landed (its vote taken;
        with sync.overlap TAU steps after the send, so no exchange is under way as membership changes), each
        fragment's."""
        return step > self.overlap and any(self.due(f, step - self.overlap) for f in range(len(self.fragments)))

    def finish(self, step: int) -> None:
        """Every rank ends on the anchor: what was sent at this step lands at once (as blocking DiLoCo's), what
        was sent before lands as it would in training, and then each fragment with steps since its send sends
        the rest of this rank's progress, landed at once (nothing a rank learnt is dropped)."""
        if not self.streaming:
            return super().finish(step)
        with position.collective("weight sync", own_timeout_s=self.across_s()):
            for f, sent in enumerate(self.sent):
                if sent is not None and sent.step == step:  # sent at this very step: it lands as blocking DiLoCo's
                    self.sent[f] = sent._replace(proxy=None)
                    self._land(f, 0.0)
                elif sent is not None:
                    self._land(f, self.mix)
            for f in range(len(self.fragments)):
                if not self.due(f, step):  # (else its weights are its anchor: it was sent at this step, and landed)
                    self._send(f, self._outer_grad(f), step)
                    self._land(f, 0.0)

    def _outer_grad(self, f: int) -> torch.Tensor:
        """How far this rank's weights of fragment f moved from its anchor (flat)."""
        lo, hi = self.fragments[f]
        return torch.cat([(a - p).reshape(-1) for a, p in zip(self.anchor[lo:hi], self.params[lo:hi])])

    @torch.no_grad()
    def synchronise(self) -> None:
        """Blocking: how far this rank moved (16, 8 or 4 bits on the wire with sync.compress) sent and landed."""
        self._send(0, self._outer_grad(0), self.step)
        self._land(0, 0.0)

    @torch.no_grad()
    def _buffers_mean(self) -> list[torch.Tensor] | None:
        """BatchNorm's statistics averaged as they are (never rounded by sync.compress, over every rank of
        every island); None without any."""
        if not self.buffers:
            return None
        mean = [b.detach().clone() for b in self.buffers]
        average_into(mean, self._average_everywhere)
        return mean

    @torch.no_grad()
    def _take_buffers(self, mean: list[torch.Tensor], mix: float) -> None:
        """The buffers' mean kept with the anchor; each rank keeps `mix` of its own, as its weights do."""
        for a, b, m in zip(self.anchor_buffers, self.buffers, mean):
            a.copy_(m)
            b.mul_(mix).add_(m, alpha=1 - mix)

    def _average_everywhere(self, flat: torch.Tensor) -> None:
        if self.islands is None:
            return self._average_exact(flat)
        nbytes = flat.numel() * flat.element_size()
        if self.replicas is not None:  # torchft: the island's mean (its own world), then the islands present's
            dist.all_reduce(flat)
            self.replicas.mean(flat.div_(self.islands.size)).wait()
            return self.count(nbytes, across=True)
        dist.all_reduce(flat)  # (the whole world: buffers are small, and sync.inner=flat leaves them apart)
        flat.div_(self.islands.count * self.islands.size)
        self.count(nbytes, across=True)

    @contextlib.contextmanager
    def consensus(self):
        """The anchor and its buffers (the model every rank agrees on), for an evaluation, as it is once what
        travels has landed; each rank's own weights and buffers are back after it."""
        if self.synced_at(self.step) and not self.streaming:
            yield
            return
        with torch.no_grad(), self.uncounted():
            landed = list(self.anchor)
            for f, sent in enumerate(self.sent):
                if sent is not None:
                    lo, hi = self.fragments[f]
                    landed[lo:hi] = self._nesterov(f, self._mean(f))
        with kept(self.params + self.buffers):
            with torch.no_grad():
                for t, a in zip(self.params + self.buffers, landed + self.anchor_buffers):
                    t.copy_(a)
            yield

    def outer_wire(self) -> str:
        return str(self.cfg.compress)

    def describe(self) -> str:
        c = self.cfg.compress
        eager = f", overlap {self.overlap} eager" + (" (paper's proxy)" if self.paper_proxy else "")
        late = (eager if self.eager else
                f", overlap {self.overlap} mix {self.mix:g}" if self.overlap else "")
        late += "" if c not in QUANTIZED or self.rounding == "nearest" else f", {self.rounding} rounding"
        late += f", fragments {len(self.fragments)}" if len(self.fragments) > 1 else ""
        return (f"diloco/{self.cfg.algo}(every {self.every}, outer lr {self.cfg.outer_lr:g}, "
                f"momentum {self.cfg.outer_momentum:g}{late})" + ("" if c == "none" else f"+{c}"))

