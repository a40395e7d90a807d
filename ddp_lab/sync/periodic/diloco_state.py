"""What a DiLoCo rank checkpoints and how it comes back (diloco.py's DiLoCoSync derives from DiLoCoState first).

Shared by every rank (saved once): the step, the anchor and its buffers, the outer momentum, and the steps at
which each fragment's outer gradient was sent if it still travels. Each rank's own: what it sent that still
travels (sent again on resume, so the sum is the same to the bit), eager's proxy anchors, the paper proxy's last
sent, error feedback's residuals as they were before a send in flight; sharded inside islands, the anchor and
outer momentum of this rank's shard too.
"""
from __future__ import annotations

import torch

from ddp_lab.collectives.quantized import Residual
from ddp_lab.config import ConfigError
from ddp_lab.sync.periodic.in_flight import InFlight


class DiLoCoState:
    """DiLoCoSync's state methods: they read its anchor, outer optimizer, fragments and what is in flight."""

    def state_tensors(self) -> list[torch.Tensor]:
        """The anchor (and its buffers), the outer momentum, and per fragment what travels (the outer gradient,
        eager's proxy anchor, the paper proxy's last mean and sent) and error feedback's residuals."""
        found = [*self.anchor, *self.anchor_buffers,
                 *(t for st in self.outer.state.values() for t in st.values() if isinstance(t, torch.Tensor))]
        for s in self.sent:
            if s is not None:
                found += [s.outer_grad, s.proxy]
        found += [t for x in self.last if x for t in x]
        found += [t for r in self.residuals or () for t in (r.sent, r.mean)]
        return [t for t in found if isinstance(t, torch.Tensor)]

    def _anchor_state(self) -> dict:
        return {"anchor": [a.detach().clone() for a in self.anchor],
                "anchor_buffers": [a.detach().clone() for a in self.anchor_buffers], "outer": self.outer.state_dict(),
                **({"last_mean": [x[0].clone() if x else None for x in self.last]} if self.paper_proxy else {})}

    def state_dict(self) -> dict:
        return {"step": self.step, "sent_at": [s.step if s else None for s in self.sent],
                **({} if self.own_anchor else self._anchor_state())}

    def own_state_dict(self) -> dict:
        """overlap: what this rank sent in the all-reduces still travelling, by fragment (sent again on resume),
        and eager's proxy anchors and last sent; sync.rounding=feedback's residuals; sharded inside islands, the
        anchor and outer momentum of this rank's shard."""
        own = self._anchor_state() if self.own_anchor else {}
        if any(self.sent):
            own["sent"] = [s.outer_grad.clone() if s else None for s in self.sent]
            if self.eager:
                own["proxy"] = [s.proxy.clone() if s and s.proxy is not None else None for s in self.sent]
        if self.paper_proxy and any(self.last):
            own["last_sent"] = [x[1].clone() if x else None for x in self.last]
        if self.residuals:  # (a fragment in flight: as before its send, which a resumed run makes again)
            own["residuals"] = [((s.before if s and s.before else r).sent, (s.before if s and s.before else r).mean)
                                for r, s in zip(self.residuals, self.sent)]
        return own

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        super().load_state_dict(shared, own)
        holder = own if self.own_anchor else shared  # (where the anchor was saved)
        if self.own_anchor and own is None:  # (another layout: this rank's shard of the anchor is another's)
            with torch.no_grad():  # the resumed weights are the anchor, the outer momentum starts again
                for a, p in zip(self.anchor, self.params):
                    a.copy_(p)
        elif "anchor" in holder:
            with torch.no_grad():
                for a, saved in zip(self.anchor + self.anchor_buffers,
                                    holder["anchor"] + holder.get("anchor_buffers", [])):
                    a.copy_(saved)
            self.outer.load_state_dict(holder["outer"])
        own = own or {}
        if self.residuals and "residuals" in own:
            self.residuals = [Residual(*kept) for kept in own["residuals"]]
        if self.paper_proxy and holder and holder.get("last_mean") and own.get("last_sent"):
            self.last = [(m, s) if m is not None else None for m, s in zip(holder["last_mean"], own["last_sent"])]
        sent_at, mine = shared.get("sent_at"), own.get("sent")
        if isinstance(sent_at, int):  # saved before fragments: one, the whole model
            sent_at, mine = [sent_at], None if mine is None else [mine]
        if sent_at is None or not any(s is not None for s in sent_at):
            return
        if len(sent_at) != len(self.fragments):
            raise ConfigError(f"the checkpoint was saved with sync.fragments={len(sent_at)} while an outer gradient "
                              f"travelled: resume with sync.fragments={len(sent_at)}")
        if mine is not None:  # (another world size: no file of this rank's; dropped)
            proxies = own.get("proxy") or [None] * len(mine)
            self.sent = [InFlight(None, None, g, at, x) if at is not None else None
                         for at, g, x in zip(sent_at, mine, proxies)]
