"""sync.mode=zero sync.zero_stage=3: the weights sharded too, gathered a block at a time.

Stages 1 and 2 (zero1.py, zero2.py) keep the whole weights on every rank. Stage 3 keeps 1/N
of everything between steps: with AdamW in fp32, 16/N bytes a parameter. The model is cut
into units: its top-level children that hold parameters (for a ModuleList, each of its
children: a GPT's blocks), or the modules of the classes sync.shard_units names. Parameters
no unit holds alone (the model's own, or the GPT's embedding tied to its output layer) form
the root unit. Each unit's weights are one flat
buffer padded to N chunks; a rank keeps chunk r (its piece, what its optimizer steps) and
frees the buffer's memory when the unit is not in use (its storage resized to 0, so the
tensors autograd saved still point at it and see the weights again once gathered).

- forward: a pre-hook all-gathers the unit's weights; a post-hook frees them and hooks the
  unit's outputs, whose gradient, in the backward, gathers them again before the unit's
  backward runs. The root unit stays gathered from the model's forward to the end of its
  backward. With sync.prefetch (and algo=builtin or direct, whose collectives run in the background),
  the hook that gathers a unit also starts the gather of the unit that comes next (in the
  forward the next one, in the backward the one before): its bytes travel while this one
  computes, at the price of one more unit's weights held.
- backward: stage 2's (Zero2Sync: a unit is its bucket), when a unit's gradients are all
  there they are reduce-scattered (units in the reverse of their order, the same on every
  rank, two of torch's in flight) into this rank's piece's gradient, and the unit's weights
  freed. At the end of the backward, units a gradient missed are sent as zeros and
  everything is freed.
- an evaluation gathers and frees unit by unit as a training forward does; a checkpoint or
  model.pt too (model_state_dict: rank 0 copies each unit while it is gathered), so no rank
  ever holds the whole weights twice. whole_weights() gathers every unit at once, to load a
  state_dict (each rank takes its chunk back after, so it sticks).

Per step the weights cross the wire twice (forward and backward) and the gradients once:
1.5 times DDP's bytes, as the ZeRO paper says. A unit's parameters must be used inside its own
forward; the model runs eagerly (trainer.compile: its hooks resize storages).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ddp_lab.collectives import (
    TORCH_ALL_GATHER,
    direct_all_gather,
    ring_textbook_all_gather,
)
from ddp_lab.sync.base import Capabilities
from ddp_lab.sync.sharded.common import return_freed_blocks, unit_modules, views_into
from ddp_lab.sync.sharded.zero2 import Zero2Sync
from ddp_lab.telemetry import position


class Unit:
    """One unit's flat weights (whole while gathered, empty otherwise) and this rank's piece of them."""

    def __init__(self, params: list[nn.Parameter], world_size: int):
        self.params = params
        self.chunk = -(-sum(p.numel() for p in params) // world_size)  # ceil: the last chunk padded
        self.flat = torch.zeros(self.chunk * world_size, dtype=params[0].dtype, device=params[0].device)
        self.nbytes = self.flat.untyped_storage().nbytes()
        self.gathered = True
        with torch.no_grad():
            for p, w in zip(params, views_into(self.flat, params)):
                w.copy_(p)
                p.data = w

    def free(self) -> None:
        self.flat.untyped_storage().resize_(0)
        self.gathered = False


class Zero3Sync(Zero2Sync):
    caps = Capabilities(syncs_in_backward=True, shards=True, forward_gathers=True, grads_set_to_none=False, sharding=3,
                        eager="sync.zero_stage=3 gathers and frees the weights in module hooks that resize "
                              "their storage")

    def _prepare(self) -> None:
        return_freed_blocks(self.env.device)

    def _lay_out(self, model: nn.Module, params: list[nn.Parameter]) -> None:
        """Units instead of buckets: each its own flat buffer, freed but while in use; this rank's
        piece of each a view into one buffer of them all."""
        n, r = self.env.world_size, self.env.rank
        owners = {}  # parameter -> the units whose modules hold it
        mods = unit_modules(model, self.cfg.shard_units)
        for i, m in enumerate(mods):
            for p in m.parameters():
                owners.setdefault(p, set()).add(i)
        alone = {i: [p for p in params if owners.get(p) == {i}] for i in range(len(mods))}
        root = [p for p in params if len(owners.get(p, ())) != 1]  # the model's own, and tied ones
        self.modules = [m for i, m in enumerate(mods) if alone[i]] + ([model] if root else [])
        # the units in the model's order, the root last
        self.forward = [Unit(ps, n) for ps in [a for a in alone.values() if a] + ([root] if root else [])]
        self.root = self.forward[-1] if root else None
        self.shard_size = sum(u.chunk for u in self.forward)
        self.mine = torch.zeros(self.shard_size, dtype=params[0].dtype, device=params[0].device)  # this rank's pieces
        offset = 0
        for u in self.forward:
            u.piece = nn.Parameter(self.mine[offset:offset + u.chunk])  # a view: one buffer for all pieces
            u.piece.detach().copy_(u.flat[r * u.chunk:(r + 1) * u.chunk])
            offset += u.chunk
            u.free()
        # sent in the reverse of the forward's order, the root last: its gradients (a tied embedding's)
        # end last, and a unit waiting for it would keep every unit after it whole until the end
        self.units = [u for u in self.forward[::-1] if u is not self.root] + ([self.root] if root else [])
        self.buckets, self.pieces = [u.params for u in self.units], [u.piece for u in self.units]
        self.chunks = [u.chunk for u in self.units]
        self.bucket_of = {id(p): i for i, u in enumerate(self.units) for p in u.params}
        self.whole = False
        self.pending: dict[int, tuple] = {}  # id(unit) -> (work, input) of a gather started ahead
        self.prefetched = 0  # gathers found already started when needed (their count, for the tests)
        self.gathering = {}  # (stage 1's all-gathers after the step: none here)
        ahead = self.cfg.prefetch and self.cfg.algo in ("builtin", "direct")
        order = self.forward[:len(self.forward) - (self.root is not None)]  # the hooks' units (root aside)
        for i, (m, u) in enumerate(zip(self.modules, self.forward)):
            after = order[i + 1] if ahead and i + 1 < len(order) else None  # the forward's next
            before = order[i - 1] if ahead and 0 < i < len(order) else None  # the backward's next
            m.register_forward_pre_hook(lambda _m, _a, u=u, nxt=after: self._gather(u, nxt))
            m.register_forward_hook(lambda _m, _a, out, u=u, nxt=before: self._after_forward(u, out, nxt))

    def _attach_grads(self) -> None:
        """Stage 2's: this rank's pieces' gradients in one buffer, laid out as the pieces are."""
        self.grads = torch.zeros_like(self.mine)
        offset = 0
        for u in self.forward:
            u.piece.grad = self.grads[offset:offset + u.chunk]
            offset += u.chunk
        self.accumulating = False

    # ------------------------------------------------------------ gathering and freeing
    def _gather(self, u: Unit, ahead: Unit | None = None) -> None:
        """Unit u's weights whole (waiting for its gather if one was started ahead); then, with
        sync.prefetch, the gather of `ahead` (the unit needed next) started in the background."""
        if not u.gathered:
            with position.collective("weight gather"), self._timed(), torch.no_grad():
                started = self.pending.pop(id(u), None)
                if started is not None:
                    started[0].wait()
                    self.prefetched += 1
                else:
                    self._start_gather(u, async_op=False)
            u.gathered = True
        if ahead is not None and not ahead.gathered and id(ahead) not in self.pending:
            with position.collective("weight gather"), self._timed(), torch.no_grad():
                self.pending[id(ahead)] = self._start_gather(ahead, async_op=True)

    def _start_gather(self, u: Unit, async_op: bool):
        """All-gather unit u's pieces into its flat weights: (work, its input), work None when done."""
        u.flat.untyped_storage().resize_(u.nbytes)
        self.count(u.nbytes // 2)  # half an all-reduce's bytes (as counted)
        piece = u.piece.detach()
        if self.cfg.algo == "builtin":  # (the input rides along: gloo reads it until the wait)
            piece = piece.clone()
            return TORCH_ALL_GATHER(u.flat, piece, async_op=async_op), piece
        r = self.env.rank
        u.flat[r * u.chunk:(r + 1) * u.chunk].copy_(piece)
        if self.cfg.algo == "direct":
            if async_op:
                return direct_all_gather(u.flat, async_op=True), piece
            direct_all_gather(u.flat)
            return None, piece
        ring_textbook_all_gather(u.flat)
        return None, piece

    def _settle(self) -> None:
        """Wait for the gathers started ahead and not needed (a forward that skipped a unit): their
        buffers must not be freed while a collective writes them."""
        for u in self.units:
            if id(u) in self.pending:
                self._gather(u)

    def _after_forward(self, u: Unit, out, ahead: Unit | None = None) -> None:
        if self.whole or u is self.root:
            return
        if torch.is_grad_enabled():  # the backward gathers the unit again before it needs it
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, u=u, nxt=ahead: self._gather(u, nxt))
        u.free()

    @contextlib.contextmanager
    def whole_weights(self):
        """Every unit gathered (a collective); after, each rank keeps its chunk of what they hold.
        Its bytes are the evaluation's or the checkpoint's, not a training step's: not counted."""
        if self.whole:
            yield
            return
        with self.uncounted():
            for u in self.forward:
                self._gather(u)
        self.whole = True
        try:
            yield
        finally:
            self.whole = False
            r = self.env.rank
            with torch.no_grad():
                for u in self.units:
                    u.piece.copy_(u.flat[r * u.chunk:(r + 1) * u.chunk])
                    u.free()

    @contextlib.contextmanager
    def consensus(self):
        """An evaluation's forward gathers and frees unit by unit, as in training (no backward keeps
        them); its bytes are not a training step's: not counted."""
        with self.uncounted():
            try:
                yield
            finally:
                self._settle()

    def model_state_dict(self, model: nn.Module) -> dict:
        """Gathered a unit at a time (every rank), copied by rank 0: no rank holds two copies of the model."""
        state = model.state_dict(keep_vars=True)
        copies = {}  # id(tensor) -> rank 0's copy (a tied weight: one copy)
        with self.uncounted():
            for u in self.forward:
                was = u.gathered
                self._gather(u)
                if self.env.is_main:
                    copies.update({id(p): p.detach().clone() for p in u.params})
                if not was:
                    u.free()
        if not self.env.is_main:
            return {}
        for t in state.values():  # buffers, frozen parameters
            if id(t) not in copies:
                copies[id(t)] = t.detach().clone()
        return {k: copies[id(t)] for k, t in state.items()}

    def load_model_state_dict(self, model: nn.Module, state: dict) -> None:
        with self.whole_weights():  # each rank keeps its chunk of what is loaded
            model.load_state_dict(state)

    # ------------------------------------------------------------ the backward (Zero2Sync's, with frees)
    def _send(self, i: int) -> None:
        """Stage 2's reduce-scatter of unit i's gradients (into a copy), then its weights freed."""
        super()._send(i)
        u = self.units[i]
        if not self.whole and u is not self.root:
            u.free()

    def _end_backward(self) -> None:
        super()._end_backward()
        self._settle()
        if not self.whole:
            for u in self.units:
                if u.gathered:
                    u.free()

    def after_step(self, step: int) -> None:
        """Nothing to send: the next forward gathers each unit from its updated pieces."""

    def describe(self) -> str:
        return f"zero3/{self.cfg.algo}"
