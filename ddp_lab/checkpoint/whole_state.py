"""A checkpoint's state read by name, a parameter at a time, whatever sync mode and world size wrote it: its
weights (CheckpointWeights; the offline consolidator writes them out, ddp_lab.tools.consolidate) and its
optimizer state (CheckpointOptimizerState), both by parameter name: a resume under another sync mode reads
each rank's part of every tensor from them, one tensor at a time (sync strategies' load_model_state_dict and
load_whole_optimizer_state): a rank holds what the new mode gives it, and one tensor or unit besides.

Where they are: whole in state.pt (ddp and the every-step strategies, zero stages 1 and 2's weights, local
SGD and DiLoCo: rank 0's), or cut over the ranks' files (zero stage 3's weights, and zero's optimizer state:
each group's flat chunks, joined and cut into its parameters by the layout the checkpoint records; fsdp's:
each parameter's rows). Where one copy is cut over an island's ranks (sync.inner=zero, HSDP), island 0's are
read. The files are mapped, not read whole: what is held at once is one unit or one tensor.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from ddp_lab.checkpoint.files import STATE, rank_file, read_meta
from ddp_lab.config import ConfigError


def _load(file: Path) -> dict:
    import torch.distributed.tensor  # noqa: F401  (fsdp's optimizer state is DTensors: the loader must know them)
    return torch.load(file, map_location="cpu", mmap=True, weights_only=True)


class _ReadByName(Mapping):
    """A Mapping whose keys are those of `self.known`, each value read when asked (__getitem__)."""
    known: dict

    def __contains__(self, name) -> bool:
        return name in self.known

    def __iter__(self):
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)


class CheckpointWeights(_ReadByName):
    """A checkpoint's weights by name (every name; tied names share one tensor), each read whole when asked: what
    is held at once is the zero stage 3 unit last asked for, or one tensor. `layout`: name -> a meta tensor of its
    shape and dtype; `tensors()`: each once, in turn."""

    def __init__(self, step_dir: Path):
        self.step_dir, self.meta = step_dir, read_meta(step_dir)
        self.shared = _load(step_dir / STATE)
        self.whole = dict(self.shared["model"])  # (sharded: the part every rank holds whole, buffers and the root)
        self.ranks: list[dict] = []
        if self.shared.get("weights_sharded"):
            first = _load(step_dir / rank_file(0))
            over = int(first.get("shards_over", self.meta["world_size"]))  # (islands: island 0's ranks)
            self.ranks = [first["weights"]] + [_load(step_dir / rank_file(r))["weights"] for r in range(1, over)]
            if "pieces" in first["weights"] and "layout" not in first["weights"]:
                raise ConfigError(f"{step_dir} was written before zero stage 3's checkpoints recorded their units' "
                                  f"layout: resume the run once with this version to write a checkpoint it can read")
        self.units = list(self._units()) if self.zero3 else []
        self.unit_of = {n: (i, j) for i, (params, _, _) in enumerate(self.units)
                        for j, (names, _) in enumerate(params) for n in names}
        self.held: tuple[int, list] = (-1, [])  # (the zero stage 3 unit last read, its parameters)
        self.layout = self.known = self._layout()

    @property
    def zero3(self) -> bool:
        return bool(self.ranks) and "pieces" in self.ranks[0]

    def _units(self):
        """(layout, numel, this unit's pieces on each rank) of every zero stage 3 unit, trainable then frozen."""
        first, offset = self.ranks[0], 0
        for layout, numel in zip(first["layout"], first["units"]):
            chunk = -(-numel // len(self.ranks))
            yield layout, numel, [w["pieces"][offset:offset + chunk] for w in self.ranks]
            offset += chunk
        for i, (layout, numel) in enumerate(zip(first.get("frozen_layout", []), first.get("frozen_units", []))):
            yield layout, numel, [w["frozen"][i] for w in self.ranks]

    def _unit(self, i: int) -> list[torch.Tensor]:
        """Zero stage 3 unit i's parameters, whole (joined over the ranks' pieces; the last one read kept)."""
        if self.held[0] != i:
            self.held = (-1, [])  # (the last unit dropped before the next is joined)
            params, numel, pieces = self.units[i]
            flat = torch.cat(pieces)[:numel]
            self.held = (i, [part.view(shape) for (_, shape), part
                             in zip(params, flat.split([math.prod(s) for _, s in params]))])
        return self.held[1]

    def _layout(self) -> dict[str, torch.Tensor]:
        layout: dict[str, torch.Tensor] = {}
        for params, _, pieces in self.units:
            for names, shape in params:
                t = torch.empty(shape, dtype=pieces[0].dtype, device="meta")
                layout.update((n, t) for n in names)
        same: dict[tuple, torch.Tensor] = {}  # (a tied weight: its names' tensors share one storage)
        if self.ranks and not self.zero3:  # fsdp: rows joined
            for name, rows in self.ranks[0].items():
                n = sum(w[name].shape[0] for w in self.ranks)
                layout[name] = same.setdefault(_where(rows), torch.empty(n, *rows.shape[1:], dtype=rows.dtype,
                                                                            device="meta"))
        for name, t in self.whole.items():
            layout[name] = same.setdefault(_where(t), torch.empty(t.shape, dtype=t.dtype, device="meta"))
        return layout

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.whole:  # (mapped: a page is read when it is touched)
            return self.whole[name]
        if name in self.unit_of:
            i, j = self.unit_of[name]
            return self._unit(i)[j]
        if self.ranks and name in self.ranks[0]:  # fsdp: each rank's rows, joined
            return torch.cat([w[name] for w in self.ranks])
        raise KeyError(name)

    def tensors(self):
        """(name, whole tensor), each once, a unit or a tensor at a time."""
        for i, (params, _, _) in enumerate(self.units):
            yield from ((names[0], t) for (names, _), t in zip(params, self._unit(i)))
        if self.ranks and not self.zero3:
            for name in self.ranks[0]:
                yield name, self[name]
        yield from self.whole.items()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight and buffer whole, under each of its names (a tied weight: one tensor, every name)."""
        return {name: self[name] for name in self}


class CheckpointOptimizerState(_ReadByName):
    """A checkpoint's optimizer state by parameter name (any of its names), each read whole when asked:
    {"exp_avg": tensor, "step": ...}. Read by the layout the checkpoint records (`optimizer_layout`: each
    optimizer parameter's model parameters, and how a rank holds it: whole, a flat chunk of them, or rows); what
    is held at once is the group (a zero bucket or unit) or the parameter last asked for. `shared`: its state.pt."""

    def __init__(self, step_dir: Path, shared: dict):
        self.layout = shared.get("optimizer_layout")
        if self.layout is None:
            raise ConfigError(f"{step_dir} was written before checkpoints recorded their optimizer's layout: resume "
                              f"it under the sync mode that wrote it (it saves one a resume across modes reads)")
        if all(entry["cut"] == "whole" for entry in self.layout):  # (every-step strategies: rank 0's, whole)
            self.states = [shared["optimizer"]]
        else:  # (zero, fsdp: each rank its shards; over an island's ranks, island 0's)
            first = _load(step_dir / rank_file(0))
            over = int(first.get("shards_over", read_meta(step_dir)["world_size"]))
            self.states = [first["optimizer"]] + [_load(step_dir / rank_file(r))["optimizer"] for r in range(1, over)]
        self.entry_of = self.known = {n: (i, j) for i, entry in enumerate(self.layout)
                                      for j, (names, _) in enumerate(entry["params"]) for n in names}
        self.held: tuple[int, list] = (-1, [])  # (the optimizer parameter last read, its model parameters' states)

    def _entry(self, i: int) -> list[dict]:
        """Optimizer parameter i's state, whole, for each of its model parameters (the last one read kept)."""
        if self.held[0] == i:
            return self.held[1]
        self.held = (-1, [])
        entry = self.layout[i]
        params = entry["params"]
        out: list[dict] = [{} for _ in params]
        for key, value in self.states[0]["state"].get(i, {}).items():
            if not (isinstance(value, torch.Tensor) and value.dim() > 0):  # (AdamW's step: every rank's)
                for state in out:
                    state[key] = value
                continue
            pieces = [_local(s["state"][i][key]) for s in self.states]
            if entry["cut"] == "flat":  # a group's flat chunks, padded to N equal ones
                flat = torch.cat(pieces)[:sum(math.prod(shape) for _, shape in params)]
                for state, (_, shape), part in zip(out, params, flat.split([math.prod(s) for _, s in params])):
                    state[key] = part.view(shape)
            else:  # whole (one rank's, mapped), or each rank's rows
                out[0][key] = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        self.held = (i, out)
        return out

    def __getitem__(self, name: str) -> dict:
        i, j = self.entry_of[name]
        return self._entry(i)[j]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _where(t: torch.Tensor) -> tuple:
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype


