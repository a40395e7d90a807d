"""model.safetensors written a tensor at a time, as model.pt is (training/model_file.py).

The safetensors format is an 8-byte header length, a JSON header naming each tensor's dtype, shape and
byte range, then the bytes: everything the header needs is in the tensors' shapes and dtypes, so the
file is laid out first and each tensor's bytes written into its range as the sync hands it out (a
sharded model gathers one unit at a time): no process holds the whole model. A tied tensor is written
once, under its first name, as transformers' save_pretrained does (from_pretrained ties the others).
Read by safetensors' load_file, transformers' from_pretrained, and model.pretrained.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ddp_lab.checkpoint.safetensors_reader import DTYPES
from ddp_lab.training.model_file import as_bytes


class SafetensorsFile:
    """model.safetensors laid out from `layout` (a state_dict whose tensors need only their shapes and dtypes),
    then filled by put(name, tensor) in any order; a tied tensor's later names are skipped."""

    def __init__(self, path: Path, layout: dict, metadata: dict | None = None):
        self.path = Path(path)
        header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
        self.ranges: dict[str, tuple[int, int]] = {}
        seen, offset = set(), 0
        for name, t in layout.items():
            if id(t) in seen:  # (tied: one tensor, written once)
                continue
            seen.add(id(t))
            size = t.numel() * t.element_size()
            header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
            self.ranges[name] = (offset, offset + size)
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # (the tensors' bytes start 8-byte aligned)
        self.start = 8 + len(text)
        self.file = open(self.path, "wb")
        self.file.write(len(text).to_bytes(8, "little") + text)
        self.file.truncate(self.start + offset)
        self.left = set(self.ranges)

    def put(self, name: str, t: torch.Tensor) -> None:
        if name not in self.ranges:  # a tied tensor's second name
            return
        begin, end = self.ranges[name]
        data = as_bytes(t)
        if data.nbytes != end - begin:
            raise ValueError(f"{name}: {data.nbytes} bytes, {end - begin} laid out")
        self.file.seek(self.start + begin)
        self.file.write(memoryview(data))
        self.left.discard(name)

    def finish(self) -> None:
        """Flushed, synced and closed; ValueError if a tensor was never written."""
        if self.left:
            raise ValueError(f"never handed out: {', '.join(sorted(self.left)[:3])}")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def close(self) -> None:
        self.file.close()


def layout_bytes(layout: dict) -> int:
    """The bytes of a state_dict's tensors, a tied one once."""
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in layout.values()}.values())


class SafetensorsShards:
    """save_pretrained's sharded layout in `folder`: model-0000k-of-0000n.safetensors of at most `max_bytes` each
    (a larger tensor alone in its file), in the layout's order, and model.safetensors.index.json naming each
    tensor's file (a tied tensor under its first name, as save_pretrained does); put, finish and close as
    SafetensorsFile's, a tensor at a time."""

    def __init__(self, folder: Path, layout: dict, max_bytes: int, metadata: dict | None = None):
        groups: list[dict] = [{}]
        seen, size, total = set(), 0, 0
        for name, t in layout.items():
            if id(t) in seen:
                continue
            seen.add(id(t))
            n = t.numel() * t.element_size()
            if groups[-1] and size + n > max_bytes:
                groups.append({})
                size = 0
            groups[-1][name] = t
            size, total = size + n, total + n
        self.folder = Path(folder)
        names = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
        self.files = [SafetensorsFile(self.folder / name, group, metadata) for name, group in zip(names, groups)]
        self.file_of = {n: f for f, group in zip(self.files, groups) for n in group}
        self.index = {"metadata": {"total_size": total},
                      "weight_map": {n: name for name, group in zip(names, groups) for n in group}}

    def put(self, name: str, t: torch.Tensor) -> None:
        if name in self.file_of:  # (not: a tied tensor's second name)
            self.file_of[name].put(name, t)

    def finish(self) -> None:
        for f in self.files:
            f.finish()
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(self.index, indent=2) + "\n")

    def close(self) -> None:
        for f in self.files:
            f.close()
