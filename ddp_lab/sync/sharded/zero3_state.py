"""Stage 3's weights out and back in, never whole on one rank: what zero3.py's units hand out and take back.

- model.pt a unit at a time (each_weight, laid out by state_layout: the fp32 master weights under bf16 gathers);
- a checkpoint: each rank's own pieces of the units, the frozen apart, with each unit's names and shapes (what
  the offline consolidator cuts a joined unit into), read back at another world size a rank's rows at a time
  (load_sharded_state);
- whole weights by name (a state_dict, or a checkpoint read a tensor at a time): each rank cuts its piece from
  its parameters' elements (load_model_state_dict); whole_weights() gathers every unit at once, for a checkpoint
  written before the pieces were saved.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ddp_lab.checkpoint.reshard import flat_rows, my_rows, padded
from ddp_lab.sync.by_name import weight_of
from ddp_lab.sync.sharded.common import load_whole_part, state_names


class UnitState:
    """Zero3Sync's state methods (it derives from this first): they read its parts, pieces and gathers."""

    @contextlib.contextmanager
    def _in_master_dtype(self):
        """Gathers of the pieces' own dtype inside (a checkpoint's, model.pt's, a whole state_dict's load),
        the compute dtype again after; every unit freed at both ends."""
        if self.param_dtype is None:
            yield
            return
        for part in self.parts:
            self._free(part)
        self._recast(master=True)
        try:
            yield
        finally:
            for part in self.parts:
                self._free(part)
            self._recast(master=False)


    @contextlib.contextmanager
    def whole_weights(self):
        """Every unit gathered (a collective); after, each rank keeps its chunk of what they hold.
        Its bytes are the evaluation's or the checkpoint's, not a training step's: not counted."""
        if self.whole:
            yield
            return
        with self._in_master_dtype():
            with self.uncounted():
                for part in self.parts:
                    self._gather(part)
            self.whole = True
            try:
                yield
            finally:
                self.whole = False
                r = self.env.rank
                with torch.no_grad():
                    for part in self.parts:
                        for u in part:
                            u.piece.copy_(u.flat[r * u.chunk:(r + 1) * u.chunk])
                            u.free()

    def each_weight(self, model: nn.Module):
        """The state_dict an entry at a time, for model.pt: each module's units gathered (every rank), their
        entries handed out, then freed; so no process holds the whole model."""
        names = state_names(model)
        handed = set()
        with self.uncounted(), self._in_master_dtype():  # (model.pt: the fp32 master weights, not bf16's)
            for part in self.parts:
                was = [u.gathered for u in part]
                self._gather(part)
                for u in part:
                    for p in u.params:
                        handed.add(id(p))
                        for name in names.get(id(p), ()):
                            yield name, p.detach()
                self._free([u for u, w in zip(part, was) if not w])
        for name, t in model.state_dict(keep_vars=True).items():  # buffers
            if id(t) not in handed:
                yield name, t.detach()

    def state_layout(self, model: nn.Module) -> dict:
        """model.pt's layout: the state_dict with each weight in its pieces' dtype (bf16 gathers: the fp32
        master each_weight hands out), a tied one still one tensor."""
        own = {id(p): u.own_dtype for part in self.parts for u in part for p in u.params}
        made: dict[int, torch.Tensor] = {}
        out = {}
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) in own and t.dtype != own[id(t)]:
                t = made.setdefault(id(t), torch.empty(t.shape, dtype=own[id(t)], device="meta"))
            out[name] = t
        return out

    def sharded_state(self, model: nn.Module) -> tuple[dict, dict]:
        """(the state every rank holds whole: buffers; this rank's pieces of the units, the frozen apart)."""
        sharded = {id(p) for part in self.parts for u in part for p in u.params}
        whole = {k: t.detach() for k, t in model.state_dict(keep_vars=True).items() if id(t) not in sharded}
        names = state_names(model)
        # each unit's parameters in their flat order, by every name and shape: what the offline consolidator
        # (ddp_lab.tools.consolidate) cuts a joined unit into, with no model to build
        layout = [[[names[id(p)], list(p.shape)] for p in u.params] for u in self.forward]
        return whole, {"pieces": self.mine.detach(), "units": [u.numel for u in self.forward],
                       "frozen": [u.piece for u in self.frozen_units],
                       "frozen_units": [u.numel for u in self.frozen_units], "layout": layout,
                       "frozen_layout": [[[names[id(p)], list(p.shape)] for p in u.params] for u in self.frozen_units]}

    def load_sharded_state(self, model: nn.Module, whole: dict, mine: dict | None, everyone: list | None) -> None:
        """Back from sharded_state(): this rank's own pieces, or at another world size its rows of each
        unit from the old ranks that held them (`everyone`'s, mapped: only those rows are read).
        ValueError where the units differ."""
        load_whole_part(model, whole)
        units, frozen = [u.numel for u in self.forward], [u.numel for u in self.frozen_units]
        for saved in [mine] if mine is not None else everyone:
            if list(saved["units"]) != units or list(saved.get("frozen_units", [])) != frozen:
                raise ValueError(f"its units hold {list(saved['units'])} weights and {saved.get('frozen_units', [])} "
                                 f"frozen, this run's {units} and {frozen}")
        with torch.no_grad():
            if mine is not None:
                self.mine.copy_(mine["pieces"])
                for u, piece in zip(self.frozen_units, mine.get("frozen", [])):
                    u.piece.copy_(piece)
                return
            n_old, new, old = len(everyone), 0, 0
            for u in self.forward:
                c_old = -(-u.numel // n_old)
                rows = my_rows(lambda q, a=old, b=old + c_old: everyone[q]["pieces"][a:b], u.numel, n_old,
                               self.env.rank, self.env.world_size)
                self.mine[new:new + u.chunk].copy_(padded(rows, u.chunk))
                new, old = new + u.chunk, old + c_old
            for i, u in enumerate(self.frozen_units):
                rows = my_rows(lambda q, i=i: everyone[q]["frozen"][i], u.numel, n_old, self.env.rank,
                               self.env.world_size)
                u.piece.copy_(padded(rows, u.chunk))

    def load_model_state_dict(self, model: nn.Module, state) -> None:
        """Whole weights by name (a dict, or a checkpoint's Mapping read a tensor at a time: checkpoint/whole_state.py):
        what every rank holds whole copied in, and of each unit only this rank's piece, cut from its parameters'
        elements (nothing gathered: no rank holds the whole model)."""
        names, r = state_names(model), self.env.rank
        sharded = {id(p) for part in self.parts for u in part for p in u.params}
        with torch.no_grad():
            for name, t in model.state_dict(keep_vars=True).items():
                if id(t) not in sharded:
                    t.copy_(weight_of(state, name, t))
            for u in (u for part in self.parts for u in part):
                u.piece.copy_(flat_rows((weight_of(state, names[id(p)][0], p) for p in u.params), r * u.chunk,
                                        min((r + 1) * u.chunk, u.numel), u.chunk, u.piece.dtype))
