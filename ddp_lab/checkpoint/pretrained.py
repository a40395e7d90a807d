"""Pretrained weights a run starts from (`model.pretrained=<path>`), read a tensor at a time.

    a .safetensors file                       read a tensor (or a run of its rows) when it is asked for, into
                                              memory of its own (checkpoint/safetensors_reader.py)
    a directory save_pretrained wrote         model.safetensors, or model.safetensors.index.json and its
                                              shards, or pytorch_model.bin (and its index)
    a torch state_dict file (.pt, .bin, ...)  torch.load(mmap=True): mapped too (ddp_lab's model.pt is one)

Names are matched as users expect: a `module.` (DDP) or `_orig_mod.` (torch.compile) prefix is dropped,
and a tied weight is one tensor under any of its names (transformers saves `lm_head.weight` tied to the
embedding once). Missing or unexpected names and shape mismatches are refused in one line, before any
weight is made (`check`). Weights are copied into the model where they are made: a whole build at once,
a meta-device build (zero stage 3, fsdp) a unit at a time as each unit is made (models/meta_init.py), so
no rank ever holds the whole model; the files are closed once the model is built (`close`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ddp_lab.checkpoint.safetensors_reader import SafetensorsReader
from ddp_lab.config import ConfigError

PREFIXES = ("module.", "_orig_mod.")
TORCH_FILES = (".pt", ".pth", ".bin")


def _plain(name: str) -> str:
    for prefix in PREFIXES:
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace("._orig_mod.", ".").replace(".module.", ".")


class PretrainedWeights:
    """The tensors a pretrained file or directory holds, by name, read one at a time."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.files: dict[str, Path] = {}  # plain name -> the file that holds it
        self.names: dict[str, str] = {}   # plain name -> its name in the file
        self._open: dict[Path, object] = {}
        for file, names in self._layout().items():
            for name in names:
                self.files[_plain(name)], self.names[_plain(name)] = file, name

    def _layout(self) -> dict[Path, list[str]]:
        p = self.path
        if not p.exists():
            raise ConfigError(f"model.pretrained={p} does not exist: point it at a .safetensors file, a directory "
                              f"save_pretrained wrote, or a torch state_dict file")
        if p.is_dir():
            for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
                if (p / index).is_file():
                    weight_map = json.loads((p / index).read_text())["weight_map"]
                    by_file: dict[Path, list[str]] = {}
                    for name, file in weight_map.items():
                        by_file.setdefault(p / file, []).append(name)
                    return by_file
            for single in ("model.safetensors", "pytorch_model.bin"):
                if (p / single).is_file():
                    return {p / single: self._names_in(p / single)}
            raise ConfigError(f"model.pretrained={p} holds no model.safetensors, model.safetensors.index.json or "
                              f"pytorch_model.bin: point it at a directory save_pretrained wrote, or at a weights file")
        return {p: self._names_in(p)}

    def _names_in(self, file: Path) -> list[str]:
        return list(self._handle(file).keys())

    def _handle(self, file: Path):
        if file not in self._open:
            try:
                if file.suffix == ".safetensors":
                    self._open[file] = SafetensorsReader(file)
                else:
                    state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
                    if not isinstance(state, dict):
                        raise ConfigError(f"model.pretrained={file} holds a {type(state).__name__}, not a state_dict")
                    self._open[file] = state.get("state_dict", state)  # (a training checkpoint's weights)
            except ConfigError:
                raise
            except Exception as e:  # (a damaged or foreign file: the library's reason, in one line)
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ConfigError(f"model.pretrained={file} cannot be read as weights: {reason}") from None
        return self._open[file]

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """The tensor under `name` (a plain name), or its rows [lo, hi) (`rows`), read now."""
        handle = self._handle(self.files[name])
        raw = self.names[name]
        if isinstance(handle, SafetensorsReader):
            return handle.get_tensor(raw, rows)
        return handle[raw] if rows is None else handle[raw][rows[0]:rows[1]]  # (mapped: only those pages read)

    def rows_of(self, found: dict[str, str]):
        """rows(name, lo, hi): rows [lo, hi) of the model's tensor `name` read from the file (`found`: match()'s;
        lo None: all of it), or None where the file does not hold it."""
        def rows(name: str, lo: int | None, hi: int | None) -> torch.Tensor | None:
            hit = found.get(name)
            return None if hit is None else self.get(hit, None if lo is None else (lo, hi))
        return rows

    def bytes_read(self) -> int:
        """Tensor bytes read so far from the safetensors files open now."""
        return sum(h.bytes_read for h in self._open.values() if isinstance(h, SafetensorsReader))

    def shape(self, name: str) -> tuple[int, ...]:
        handle = self._handle(self.files[name])
        raw = self.names[name]
        return handle.shape(raw) if isinstance(handle, SafetensorsReader) else tuple(handle[raw].shape)

    def close(self) -> None:
        """Every file closed (a torch file's mapping dropped); a later get() opens it again."""
        for handle in self._open.values():
            if isinstance(handle, SafetensorsReader):
                handle.close()
        self._open.clear()

    # ------------------------------------------------------------ matching a model
    def match(self, model: nn.Module) -> dict[str, str]:
        """Each name of each parameter and persistent buffer of `model` (a tied one: all its names) -> the name
        it is read from, checked: refused in one line where the file lacks a parameter, holds a name the model
        has not, or a shape differs."""
        aliases: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False), *_persistent_buffers(model)]:
            aliases.setdefault(id(t), []).append(name)
            tensors[id(t)] = t
        found, missing = {}, []
        for key, names in aliases.items():
            hit = next((_plain(n) for n in names if _plain(n) in self.files), None)
            if hit is not None:
                found.update((n, hit) for n in names)
                found[hit + "\0shape"] = tuple(tensors[key].shape)
            elif isinstance(tensors[key], nn.Parameter) and not _ignored(model, names[0], "missing"):
                missing.append(names[0])
        known = {_plain(n) for names in aliases.values() for n in names}
        unexpected = [n for n in self.files if n not in known and not _ignored(model, n, "unexpected")]
        what = f"model.pretrained={self.path}"
        if missing and len(missing) == len(aliases):
            raise ConfigError(f"{what} holds none of the model's weights ({_few(missing)} missing; it holds "
                              f"{_few(list(self.files))}): is it another model's?")
        if missing or unexpected:
            said = [f"missing {len(missing)}: {_few(missing)}" if missing else "",
                    f"unexpected {len(unexpected)}: {_few(unexpected)}" if unexpected else ""]
            raise ConfigError(f"{what} does not fit the model: {'; '.join(s for s in said if s)}")
        wrong = [f"{n} {list(self.shape(n))} (the model's {list(found.pop(k))})" for k in list(found)
                 if k.endswith("\0shape") and self.shape(n := k[:-6]) != found[k]]
        if wrong:
            raise ConfigError(f"{what} does not fit the model: shape mismatch {_few(wrong)}")
        return {k: v for k, v in found.items() if not k.endswith("\0shape")}

    def fill(self, module: nn.Module, prefix: str, found: dict[str, str], only: set[int] | None = None) -> int:
        """Copy into `module`'s real tensors (its parameters and buffers; `only`: those whose ids it holds) the
        file's, by their names in the model (`prefix`: the module's path); the count copied."""
        done: set[int] = set()
        with torch.no_grad():
            for name, t in [*module.named_parameters(prefix, remove_duplicate=False),
                            *module.named_buffers(prefix, remove_duplicate=False)]:
                hit = found.get(name)
                if hit is None or t.is_meta or id(t) in done or (only is not None and id(t) not in only):
                    continue
                t.copy_(self.get(hit))
                done.add(id(t))
        return len(done)


def _persistent_buffers(model: nn.Module):
    for path, m in model.named_modules():
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                yield (f"{path}.{name}" if path else name), b


def _ignored(model: nn.Module, name: str, which: str) -> bool:
    """transformers' own allowances (`_keys_to_ignore_on_load_missing` / `..._unexpected`, patterns)."""
    import re
    patterns = getattr(model, f"_keys_to_ignore_on_load_{which}", None) or []
    return any(re.search(p, name) for p in patterns)


def _few(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def load_whole(model: nn.Module, path: str) -> int:
    """A whole-built model's weights from `path`; the tensors read."""
    weights = PretrainedWeights(path)
    try:
        return weights.fill(model, "", weights.match(model))
    finally:
        weights.close()
