"""The bytes of Python objects a dataset holds: what each DataLoader worker may copy of it.

A worker is forked from its rank and shares its pages until it writes one; reading a Python object writes its
reference count, so a worker that loads samples held as Python objects (lists, tuples, floats, strings, dicts)
copies the pages that hold them, up to the whole dataset over the epochs (the pages mix samples of every
worker's batches). A tensor's or an array's buffer is only read: not copied, not counted (its object is), but
for an array of Python objects (pandas' strings), whose items are.

Counted by walking what the dataset refers to, each object once, without descending into modules, classes and
functions (shared code, not data); a container of more than SAMPLED items is counted from SAMPLED of them, evenly
spaced, scaled to its length (a million samples are counted in milliseconds, as their average). Each object's
size is rounded up to the allocator's alignment.
"""
from __future__ import annotations

import sys
import types

import torch

SAMPLED = 256
ALIGN = 16  # the allocator's: a 24-byte float takes 32
LIMIT = 200_000  # objects visited at most (what is past it is not counted)
CODE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
        types.CodeType, types.FrameType)


def object_bytes(dataset) -> int:
    """The bytes of the Python objects `dataset` refers to, itself included (estimated: see the module)."""
    seen: set[int] = set()

    def walk(obj, depth: int) -> float:
        if id(obj) in seen or isinstance(obj, CODE) or len(seen) >= LIMIT or depth > 50:
            return 0
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor) or type(obj).__module__ == "numpy":
            if getattr(getattr(obj, "dtype", None), "hasobject", False) and getattr(obj, "ndim", 0):
                # an array of Python objects (pandas' strings): its items too
                return object.__sizeof__(obj) + _items(obj.reshape(-1), walk, depth)
            return object.__sizeof__(obj)  # (its buffer only read)
        if obj is None or isinstance(obj, bool) or type(obj) is int and -5 <= obj <= 256:
            return 0  # (the interpreter's own, shared by every process)
        size = -(-sys.getsizeof(obj, 0) // ALIGN) * ALIGN
        if isinstance(obj, (str, bytes, bytearray, int, float, complex)):
            return size
        if isinstance(obj, dict):
            return size + _items(list(obj.keys()) + list(obj.values()), walk, depth)
        if isinstance(obj, (list, tuple, set, frozenset)):
            return size + _items(list(obj) if isinstance(obj, (set, frozenset)) else obj, walk, depth)
        inner = [v for v in (getattr(obj, "__dict__", None),) if v is not None]
        inner += [getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
        return size + sum(walk(v, depth + 1) for v in inner)

    return int(walk(dataset, 0))


def _items(items, walk, depth: int) -> float:
    """The items' bytes: all of them, or SAMPLED evenly spaced scaled to all."""
    n = len(items)
    if n <= SAMPLED:
        return sum(walk(v, depth + 1) for v in items)
    step = n / SAMPLED
    return sum(walk(items[int(i * step)], depth + 1) for i in range(SAMPLED)) * step
