"""A module's weights as zero stage 3 holds them (zero3.py): flat buffers, one per kind of parameter,
whole while gathered and empty otherwise, and this rank's piece of each.

The kinds (units_of): trainable in optimizer group 0, or 1 (optim.no_decay's), and frozen, each of one
dtype, so that a flat chunk, the optimizer's parameter, never mixes two. Each buffer is padded to N equal
chunks; rank r keeps chunk r. Freeing resizes the storage to 0, so the tensors autograd saved still point
at it and see the weights again once gathered; recast() gathers into a buffer of another dtype (bf16
weights over fp32 pieces).
"""
from __future__ import annotations

import torch
from torch import nn

from ddp_lab.sync.sharded.common import views_into


class Unit:
    """A flat buffer of a module's weights of one kind (whole while gathered, empty otherwise) and this
    rank's piece of it. The kind: trainable in optimizer group `group` (0, or 1 for optim.no_decay's), or
    frozen (group None: gathered, never reduce-scattered or stepped). Its parameters become views into
    the flat weights: the model's own, holding their values, or, on the meta device, new parameters
    (`made`: old -> new, for the caller to put in the model)."""

    def __init__(self, params: list[nn.Parameter], world_size: int, device: torch.device, group: int | None = 0):
        self.group, self.in_root = group, False
        self.numel = sum(p.numel() for p in params)
        self.chunk = -(-self.numel // world_size)  # ceil: the last chunk padded
        self.flat = torch.empty(self.chunk * world_size, dtype=params[0].dtype, device=device)
        self.own_dtype = self.flat.dtype  # (its pieces' dtype; recast() may gather in another)
        self.flat[self.numel:].zero_()  # the padding (only its pages are touched)
        self.nbytes = self.flat.untyped_storage().nbytes()
        self.gathered = True
        self.made: dict[int, nn.Parameter] = {}
        views = views_into(self.flat, params)
        if params[0].is_meta:
            self.params = []
            for p, w in zip(params, views):  # (.data set, as below: its own version counter, not the flat's,
                q = nn.Parameter(torch.empty(0, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
                q.data = w  # which the gathers bump while autograd holds what the forward saved)
                self.params.append(q)
            self.made = {id(p): q for p, q in zip(params, self.params)}
            return
        self.params = params
        with torch.no_grad():
            for p, w in zip(params, views):
                w.copy_(p)
                p.data = w

    @property
    def frozen(self) -> bool:
        return self.group is None

    def recast(self, dtype: torch.dtype) -> None:
        """Gather into a flat buffer of `dtype` from now on (its parameters views of it, freed): bf16 weights
        for the forward and backward while the pieces stay the fp32 master weights."""
        if self.flat.dtype == dtype:
            return
        self.flat = torch.empty(self.flat.numel(), dtype=dtype, device=self.flat.device)
        self.nbytes = self.flat.untyped_storage().nbytes()
        for p, w in zip(self.params, views_into(self.flat, self.params)):
            p.data = w
        self.free()

    def allocate(self) -> None:
        """The flat weights' memory back, their values undefined (but the padding's): to be filled."""
        self.flat.untyped_storage().resize_(self.nbytes)
        self.flat[self.numel:].zero_()
        self.gathered = True

    def free(self) -> None:
        self.flat.untyped_storage().resize_(0)
        self.gathered = False


def units_of(params: list[nn.Parameter], world_size: int, device: torch.device, group_of: dict) -> list[Unit]:
    """A module's parameters as Units, one per kind (optimizer group, frozen and dtype), so that a flat chunk
    holds one kind only."""
    kinds: dict[tuple, list] = {}
    for p in params:
        kinds.setdefault((group_of.get(id(p), 0) if p.requires_grad else None, str(p.dtype)), []).append(p)
    return [Unit(ps, world_size, device, group) for (group, _), ps in kinds.items()]
