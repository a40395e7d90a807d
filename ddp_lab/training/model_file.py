"""model.pt written a tensor at a time, so that no process holds the whole model to export it.

model.pt is what `torch.load(..., weights_only=True)` reads into a plain model's load_state_dict.
torch.save needs every tensor at once; here the file is laid out first from the tensors' shapes
alone (torch.serialization.skip_data over fake tensors: the pickle and a hole of the right size
for each tensor's bytes), then each tensor's bytes are written into its hole as the sync hands it
out (a sharded model gathers one unit at a time). Tied tensors (the GPT's embedding and output
layer) share one storage, as torch.save would write them.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def _skeleton(state: dict) -> tuple[dict, dict[int, str]]:
    """(fake tensors shaped as `state`'s, contiguous; id(tensor) -> its storage's record name), tied
    tensors one fake tensor, the records numbered in the order torch.save meets the storages."""
    fakes, records, made = {}, {}, {}
    with FakeTensorMode():
        for name, t in state.items():
            if id(t) not in made:
                made[id(t)] = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                records[id(t)] = f"data/{len(records)}"
            fakes[name] = made[id(t)]
    return fakes, records


def as_bytes(t: torch.Tensor):
    """A copy of a tensor's elements, contiguous, as the bytes torch.save stores (a copy: numpy's view of a
    storage would pin its size, and a sharded model frees the storage its weights were gathered into)."""
    return t.detach().reshape(-1).cpu().clone().view(torch.uint8).numpy()


class ModelFile:
    """model.pt laid out from `layout` (a state_dict whose tensors need only their shapes and dtypes:
    meta, freed, or DTensors), then filled by put(name, tensor) in any order."""

    def __init__(self, path: Path, layout: dict):
        self.path = Path(path)
        self.names = {name: id(t) for name, t in layout.items()}
        fakes, self.records = _skeleton(layout)
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            torch.save(fakes, self.path)
        reader = torch._C.PyTorchFileReader(str(self.path))
        self.offsets = {}
        for key, record in self.records.items():
            self.offsets[key] = reader.get_record_offset(record)
        self.sizes = {id(t): t.numel() * t.element_size() for t in layout.values()}
        self.file = open(self.path, "r+b")
        self.left = set(self.records)  # tensors not yet written

    def put(self, name: str, t: torch.Tensor) -> None:
        key = self.names[name]
        data = as_bytes(t)
        if data.nbytes != self.sizes[key]:
            raise ValueError(f"{name}: {data.nbytes} bytes, {self.sizes[key]} laid out")
        self.file.seek(self.offsets[key])
        self.file.write(memoryview(data))
        self.left.discard(key)

    def finish(self) -> None:
        """Flushed, synced and closed; ValueError if a tensor was never written."""
        if self.left:
            missing = [n for n, k in self.names.items() if k in self.left]
            raise ValueError(f"never handed out: {', '.join(missing[:3])}")
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def close(self) -> None:
        self.file.close()
