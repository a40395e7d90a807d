"""sync=zero sync.zero_stage=3: the weights sharded too, gathered a block at a time.

Stages 1 and 2 (zero1.py, zero2.py) keep the whole weights on every rank. Stage 3 keeps 1/N
of everything: with AdamW in fp32, 16/N bytes a parameter at the optimizer step. The model is cut
into units (units.py: sync.shard_units=auto, the repeated block class at any depth, else by
size; or the classes it names). Parameters no unit holds alone (the model's own, or the GPT's
embedding tied to its output layer) form the root unit. A unit's parameters are laid out by kind
(units_of): trainable in optimizer group 0 or 1 (optim.no_decay's), and frozen, each kind one
flat buffer padded to N chunks; a rank keeps chunk r (its piece: what its optimizer steps, the
frozen ones only kept) and frees the buffer's memory when the unit is not in use (its storage
resized to 0, so the tensors autograd saved still point at it and see the weights again once
gathered). Under trainer.amp=bf16 the buffers are bf16 (sync.param_dtype=amp): the pieces stay
fp32, the master weights, and each is cast on its way to the gather.

- forward: a pre-hook all-gathers the unit's weights; a post-hook frees them and hooks the
  unit's outputs, whose gradient, in the backward, gathers them again before the unit's
  backward runs. The root unit stays gathered from the model's forward to the end of its
  backward. With sync.prefetch (and algo=builtin or direct, whose collectives run in the background),
  the hook that gathers a unit also starts the gather of the unit that comes next (in the
  forward the next one, in the backward the one before): its bytes travel while this one
  computes, at the price of one more unit's weights held.
- backward: stage 2's (Zero2Sync: a unit is its bucket), when a unit's gradients are all
  there its weights are freed and the gradients reduce-scattered (units in the reverse of their
  order, the same on every rank, one in flight while the next unit's backward runs; in
  sync.reduce_dtype under bf16 weights) into this rank's piece's gradient; a frozen kind is
  freed once the gradient of the module's input is there. At the end of the backward, units a gradient missed are sent
  as zeros and everything is freed.
- built from a meta-device model (models/meta_init.py), each unit is made whole, initialised
  as the whole build would, cut to this rank's piece and freed before the next is made.
- an evaluation gathers and frees unit by unit as a training forward does; model.pt is written
  a unit at a time as each is gathered (each_weight); a checkpoint holds each rank's own pieces
  (sharded_state), read back at another world size a rank's rows at a time; so no rank ever
  holds the whole weights. whole_weights() gathers every unit at once, to load a whole
  state_dict (a checkpoint written before the pieces were saved: each rank takes its chunk
  back after, so it sticks). These are zero3_state.py's.

Per step the weights cross the wire twice (forward and backward) and the gradients once:
1.5 times DDP's bytes, as the ZeRO paper says (bf16 weights: 1, with bf16 gradients 0.75). A unit's
parameters must be used inside its own forward (outside_use.py refuses the first step that does
not); the model runs eagerly (trainer.compile: its hooks resize storages).
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ddp_lab.collectives import (
    TORCH_ALL_GATHER,
    direct_all_gather,
    ring_textbook_all_gather,
)
from ddp_lab.distributed import host_malloc
from ddp_lab.models.meta_init import make_the_rest_real, swap_parameters
from ddp_lab.sync.base import NO_CONTEXT, Capabilities, SyncContext
from ddp_lab.sync.sharded.common import REDUCE_DTYPES
from ddp_lab.sync.sharded.flat_unit import Unit, units_of
from ddp_lab.sync.sharded.outside_use import check_first_forward
from ddp_lab.sync.sharded.units import announce, unit_modules
from ddp_lab.sync.sharded.zero2 import Zero2Sync
from ddp_lab.sync.sharded.zero3_state import UnitState
from ddp_lab.telemetry import position


class Zero3Sync(UnitState, Zero2Sync):
    max_in_flight = 1  # (zero1.py's IN_FLIGHT)
    caps = Capabilities(syncs_in_backward=True, shards=True, forward_gathers=True, sharding=3,
                        flat_shards=True,
                        eager="sync.zero_stage=3 gathers and frees the weights in module hooks that resize "
                              "their storage")

    def __init__(self, model: nn.Module, env, cfg, ctx: SyncContext = NO_CONTEXT):
        # ctx.param_dtype (trainer.amp=bf16): the units gathered in it, the pieces (what the optimizer steps) kept
        # in the parameters' own dtype; the gradients reduce-scattered in sync.reduce_dtype
        param_dtype = ctx.param_dtype
        self.param_dtype = param_dtype
        self.reduce_dtype = REDUCE_DTYPES[cfg.reduce_dtype] if param_dtype else None
        super().__init__(model, env, cfg, ctx)

    def _prepare(self) -> None:
        host_malloc.for_sharded(self.env.device)  # trainer.host_malloc=auto: lean

    def _lay_out(self, model: nn.Module, params: list[nn.Parameter]) -> None:
        """Units instead of buckets: each module's its own flat buffers (units_of), freed but while in use;
        this rank's pieces of the trainable ones views into one buffer, of the frozen ones into another."""
        n, r = self.env.world_size, self.env.rank
        every = list(dict.fromkeys(model.parameters()))  # frozen ones too (tied ones once)
        owners = {}  # parameter -> the units whose modules hold it
        mods = unit_modules(model, self.cfg.shard_units, self.cfg.unit_mb)
        announce(model, mods, self.cfg, self.env.is_main)
        for i, m in enumerate(mods):
            for p in m.parameters():
                owners.setdefault(p, set()).add(i)
        alone = {i: [p for p in every if owners.get(p) == {i}] for i in range(len(mods))}
        root = [p for p in every if len(owners.get(p, ())) != 1]  # the model's own, and tied ones
        device = self.env.device
        # the parts: each module gathered one at a time, with its Units; the root (the model's own) last
        self.modules = [m for i, m in enumerate(mods) if alone[i]] + ([model] if root else [])
        self.parts = [units_of(ps, n, device, self.group_of) for ps in [a for a in alone.values() if a] + [root] if ps]
        self.root_part = self.parts[-1] if root else []
        for u in self.root_part:
            u.in_root = True
        self.root = next((u for u in self.root_part if not u.frozen), None)  # the root's trainable unit
        every_unit = [u for part in self.parts for u in part]
        self.forward = [u for u in every_unit if not u.frozen]  # the trainable ones, in the model's order
        self.frozen_units = [u for u in every_unit if u.frozen]
        meta = every[0].is_meta
        if meta:  # a meta-device build: the units' new parameters in the model, the buffers made real
            swap_parameters(model, {k: v for u in every_unit for k, v in u.made.items()})
            make_the_rest_real(model, device)
        self.shard_size = sum(u.chunk for u in self.forward)
        self.mine = torch.zeros(self.shard_size, dtype=params[0].dtype, device=device)  # this rank's pieces
        self.frozen_mine = [torch.zeros(u.chunk, dtype=u.flat.dtype, device=device) for u in self.frozen_units]
        offset = 0
        for u in self.forward:
            u.piece = nn.Parameter(self.mine[offset:offset + u.chunk])  # a view: one buffer for all pieces
            offset += u.chunk
        for u, piece in zip(self.frozen_units, self.frozen_mine):
            u.piece = piece
        for u in every_unit:
            if not meta:
                u.piece.detach().copy_(u.flat[r * u.chunk:(r + 1) * u.chunk])
            if not u.in_root or not meta:
                u.free()
        if meta:
            self._initialise(model)
        self._recast(master=False)
        # sent in the reverse of the forward's order, the root last: its gradients (a tied embedding's)
        # end last, and a unit waiting for it would keep every unit after it whole until the end
        self.units = [u for u in self.forward[::-1] if not u.in_root] + [u for u in self.forward if u.in_root]
        self.buckets, self.pieces = [u.params for u in self.units], [u.piece for u in self.units]
        self.groups = [u.group for u in self.units]
        self.chunks = [u.chunk for u in self.units]
        self.bucket_of = {id(p): i for i, u in enumerate(self.units) for p in u.params}
        self.whole = False
        self.pending: dict[int, tuple] = {}  # id(unit) -> (work, input) of a gather started ahead
        self.prefetched = 0  # gathers found already started when needed (their count, for the tests)
        self.gathering = {}  # (stage 1's all-gathers after the step: none here)
        ahead = self.cfg.prefetch and self.cfg.algo in ("builtin", "direct")
        order = self.parts[:len(self.parts) - bool(root)]  # the hooks' parts (root aside)
        for i, (m, part) in enumerate(zip(self.modules, self.parts)):
            after = order[i + 1] if ahead and i + 1 < len(order) else []  # the forward's next
            before = order[i - 1] if ahead and 0 < i < len(order) else []  # the backward's next
            m.register_forward_pre_hook(lambda _m, args, part=part, nxt=after: self._before_forward(part, args, nxt))
            m.register_forward_hook(lambda _m, _a, out, part=part, nxt=before: self._after_forward(part, out, nxt))
        check_first_forward(model, self.modules[:len(order)])

    def _initialise(self, model: nn.Module) -> None:
        """A meta-device build's weights, made a unit at a time (models/meta_init.py): each module's units
        allocated, initialised as the whole build would, cut to this rank's pieces and freed; the root whole
        meanwhile."""
        r = self.env.rank

        def keep(part: list[Unit]) -> None:
            with torch.no_grad():
                for u in part:
                    u.piece.copy_(u.flat[r * u.chunk:(r + 1) * u.chunk])
                    u.free()

        def allocate(part: list[Unit]) -> None:
            for u in part:
                u.allocate()

        names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}

        def fill_rows(i: int, rows) -> None:  # (pretrained weights: this rank's piece of each unit, read from the file)
            with torch.no_grad():
                for u in parts[i]:
                    lo, hi, at = r * u.chunk, min((r + 1) * u.chunk, u.numel), 0
                    for p in u.params:  # each parameter's elements the piece covers, from the rows that hold them
                        a, b, row = max(lo, at), min(hi, at + p.numel()), max(1, math.prod(p.shape[1:]))
                        if a < b:
                            first = (a - at) // row
                            got = (rows(names[id(p)], first, -(-(b - at) // row)) if p.dim()
                                   else rows(names[id(p)], None, None))
                            if got is not None:
                                skip = a - at - first * row
                                u.piece[a - lo:b - lo].copy_(got.reshape(-1)[skip:skip + b - a])
                        at += p.numel()

        parts = self.parts[:len(self.parts) - bool(self.root_part)]
        self.init.materialise(self.modules[:len(parts)], [p for u in self.root_part for p in u.params],
                              lambda i: allocate(parts[i]), lambda i: keep(parts[i]), fill_rows)
        keep(self.root_part)

    def _recast(self, master: bool) -> None:
        """Every unit gathered in sync's param_dtype from now on (master: in its pieces' own); each must be free."""
        if self.param_dtype is not None:
            for part in self.parts:
                for u in part:
                    u.recast(u.own_dtype if master or not u.own_dtype.is_floating_point else self.param_dtype)

    def trained_shards(self) -> list[torch.Tensor]:
        """This rank's trainable pieces, in the model's order (views into one buffer, what the optimizer steps)."""
        return [u.piece for u in self.forward]

    # ------------------------------------------------------------ gathering and freeing
    def _gather(self, part: list[Unit], ahead: list[Unit] = ()) -> None:
        """A module's units whole (waiting for their gathers if started ahead); then, with sync.prefetch,
        the gathers of `ahead` (the module's needed next) started in the background."""
        for u in part:
            if not u.gathered:
                with position.collective("weight gather"), self._timed(), torch.no_grad():
                    started = self.pending.pop(id(u), None)
                    if started is not None:
                        started[0].wait()
                        self.prefetched += 1
                    else:
                        self._start_gather(u, async_op=False)
                u.gathered = True
        for u in ahead:
            if not u.gathered and id(u) not in self.pending:
                with position.collective("weight gather"), self._timed(), torch.no_grad():
                    self.pending[id(u)] = self._start_gather(u, async_op=True)

    def _start_gather(self, u: Unit, async_op: bool):
        """All-gather unit u's pieces into its flat weights: (work, its input), work None when done."""
        u.flat.untyped_storage().resize_(u.nbytes)
        self.count(u.nbytes // 2)  # half an all-reduce's bytes (as counted)
        piece = u.piece.detach()
        if self.cfg.algo == "builtin":  # (the input rides along: gloo reads it until the wait)
            piece = piece.to(u.flat.dtype, copy=True)  # (bf16 weights: cast before the wire)
            return TORCH_ALL_GATHER(u.flat, piece, group=self.env.group, async_op=async_op), piece
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
        for part in self.parts:
            if any(id(u) in self.pending for u in part):
                self._gather([u for u in part if id(u) in self.pending])

    def _before_forward(self, part: list[Unit], args, ahead: list[Unit]) -> None:
        self._gather(part, ahead)
        frozen = [u for u in part if u.frozen and not u.in_root]
        if frozen and torch.is_grad_enabled():  # frozen weights: freed once the backward is past the module
            for t in tree_leaves(args):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, frozen=frozen: self._free(frozen))

    def _after_forward(self, part: list[Unit], out, ahead: list[Unit] = ()) -> None:
        if self.whole or part is self.root_part:
            return
        if torch.is_grad_enabled():  # the backward gathers the unit again before it needs it
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, part=part, nxt=ahead: self._gather(part, nxt))
        self._free(part)

    def _free(self, units: list[Unit]) -> None:
        if not self.whole:
            for u in units:
                if u.gathered and id(u) not in self.pending:
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

    # ------------------------------------------------------------ the backward (Zero2Sync's, with frees)
    def _send(self, i: int) -> None:
        """Unit i's weights freed (every gradient of theirs is there: the backward is past them), then
        stage 2's reduce-scatter of its gradients (into a copy)."""
        u = self.units[i]
        if not u.in_root:
            self._free([u])
        super()._send(i)

    def _end_backward(self) -> None:
        super()._end_backward()
        self._settle()
        for part in self.parts:
            self._free(part)

    def after_step(self, step: int) -> None:
        """Nothing to send: the next forward gathers each unit from its updated pieces."""
