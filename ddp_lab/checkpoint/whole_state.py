"""A checkpoint's state read whole, a parameter at a time, whatever sync mode and world size wrote it: its
weights (CheckpointWeights; the offline consolidator writes them out, ddp_lab.tools.consolidate) and its
optimizer state by parameter name (whole_optimizer_state; a resume under another sync mode loads both).

Where they are: whole in state.pt (ddp and the every-step strategies, zero stages 1 and 2's weights, local
SGD and DiLoCo: rank 0's), or cut over the ranks' files (zero stage 3's weights, and zero's optimizer state:
each group's flat chunks, joined and cut into its parameters by the layout the checkpoint records; fsdp's:
each parameter's rows). Where one copy is cut over an island's ranks (sync.inner=zero, HSDP), island 0's are
read. The files are mapped, not read whole: what is held at once is one unit or one tensor.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ddp_lab.checkpoint.files import STATE, rank_file, read_meta
from ddp_lab.config import ConfigError


def _load(file: Path) -> dict:
    import torch.distributed.tensor  # noqa: F401  (fsdp's optimizer state is DTensors: the loader must know them)
    return torch.load(file, map_location="cpu", mmap=True, weights_only=True)


class CheckpointWeights:
    """A checkpoint's weights: `layout` (name -> a meta tensor of its shape and dtype; tied names share one) and
    `tensors()`, each whole in turn."""

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
        self.layout = self._layout()

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

    def _layout(self) -> dict[str, torch.Tensor]:
        layout: dict[str, torch.Tensor] = {}
        if self.zero3:
            for params, _, pieces in self._units():
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

    def tensors(self):
        """(name, whole tensor), each once, a unit or a tensor at a time."""
        if self.zero3:
            for params, numel, pieces in self._units():
                flat = torch.cat(pieces)[:numel]
                for (names, shape), part in zip(params, flat.split([math.prod(s) for _, s in params])):
                    yield names[0], part.view(shape)
                del flat
        elif self.ranks:
            for name in self.ranks[0]:
                yield name, torch.cat([w[name] for w in self.ranks])
        yield from self.whole.items()


    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight and buffer whole, under each of its names (a tied weight: one tensor, every name)."""
        out: dict[str, torch.Tensor] = {}
        if self.zero3:
            for params, numel, pieces in self._units():
                flat = torch.cat(pieces)[:numel]
                for (names, shape), part in zip(params, flat.split([math.prod(s) for _, s in params])):
                    out.update((n, part.view(shape)) for n in names)
        elif self.ranks:
            out.update((name, torch.cat([w[name] for w in self.ranks])) for name in self.ranks[0])
        out.update(self.whole)
        return out


def whole_optimizer_state(step_dir: Path, shared: dict) -> dict[str, dict]:
    """The optimizer state of every parameter, whole, by its first name: {name: {"exp_avg": tensor, "step": ...}},
    from the layout the checkpoint records (`optimizer_layout`: each optimizer parameter's model parameters, and
    how a rank holds it: whole, a flat chunk of them, or rows). `shared`: its state.pt."""
    layout = shared.get("optimizer_layout")
    if layout is None:
        raise ConfigError(f"{step_dir} was written before checkpoints recorded their optimizer's layout: resume it "
                          f"under the sync mode that wrote it (it saves one a resume across modes reads)")
    if all(entry["cut"] == "whole" for entry in layout):  # (every-step strategies: rank 0's, whole)
        states = [shared["optimizer"]]
    else:  # (zero, fsdp: each rank its shards; over an island's ranks, island 0's)
        first = _load(step_dir / rank_file(0))
        over = int(first.get("shards_over", read_meta(step_dir)["world_size"]))
        states = [first["optimizer"]] + [_load(step_dir / rank_file(r))["optimizer"] for r in range(1, over)]
    out: dict[str, dict] = {}
    for i, entry in enumerate(layout):
        params = entry["params"]
        for names, _ in params:
            out[names[0]] = {}
        for key, value in states[0]["state"].get(i, {}).items():
            if not (isinstance(value, torch.Tensor) and value.dim() > 0):  # (AdamW's step: every rank's)
                for names, _ in params:
                    out[names[0]][key] = value
                continue
            pieces = [_local(s["state"][i][key]) for s in states]
            if entry["cut"] == "flat":  # a group's flat chunks, padded to N equal ones
                flat = torch.cat(pieces)[:sum(math.prod(shape) for _, shape in params)]
                for (names, shape), part in zip(params, flat.split([math.prod(s) for _, s in params])):
                    out[names[0]][key] = part.view(shape)
            else:  # whole (one rank's), or each rank's rows
                out[params[0][0][0]][key] = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _where(t: torch.Tensor) -> tuple:
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype


