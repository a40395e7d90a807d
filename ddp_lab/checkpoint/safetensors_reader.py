"""A .safetensors file read a tensor, or a run of its rows, at a time with plain reads (its format:
training/safetensors_file.py).

safetensors' own safe_open maps the file: every page a rank copies a tensor from stays mapped, and counted in
its RSS, until the file is closed, so a rank that reads the whole file for its units ends its build holding
a mapped copy of the whole model. Read here into memory of its own, a tensor is gone when it is dropped, and
a rank that needs rows [lo, hi) of a tensor reads only their bytes (a row-major tensor's rows are one range).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

# the format's dtype names (the writer's too)
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}


class SafetensorsReader:
    """The tensors of one .safetensors file by name: keys(), shape(name), get_tensor(name, rows=None)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.file = open(self.path, "rb")
        size = int.from_bytes(self.file.read(8), "little")
        if size <= 0 or size > 100 * 2**20:  # (safetensors caps its header at 100 MB)
            raise ValueError(f"not a safetensors file (header size {size})")
        self.header = json.loads(self.file.read(size))
        self.header.pop("__metadata__", None)
        self.start = 8 + size
        self.bytes_read = 0  # (of tensors: what a rank that reads only its rows reads)
        unknown = {h["dtype"] for h in self.header.values()} - set(TORCH_DTYPES)
        if unknown:
            raise ValueError(f"it holds tensors of dtype {', '.join(sorted(unknown))}, which ddp_lab does not read")

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def get_tensor(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """The tensor under `name`, or its rows [lo, hi) (`rows`), read now into a tensor of its own."""
        entry = self.header[name]
        shape, dtype = list(entry["shape"]), TORCH_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        if rows is not None:
            lo, hi = rows
            row = (end - begin) // shape[0] if shape and shape[0] else 0
            begin, end, shape = begin + lo * row, begin + hi * row, [hi - lo, *shape[1:]]
        out = torch.empty(shape, dtype=dtype)
        if end > begin:
            self.file.seek(self.start + begin)
            got = self.file.readinto(memoryview(out.view(-1).view(torch.uint8).numpy()))
            if got != end - begin:
                raise ValueError(f"{self.path} ends inside {name} (read {got} of {end - begin} bytes)")
            self.bytes_read += got
        return out

    def close(self) -> None:
        self.file.close()
