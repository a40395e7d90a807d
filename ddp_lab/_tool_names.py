"""The tools' short names: `ddp_lab.bench.scaling` is `ddp_lab.tools.bench.scaling`, the same module.

Why: the tools live in ddp_lab/tools/, apart from the core, but `python -m ddp_lab.bench.<name>`,
`ddp_lab.costmodel`, `ddp_lab.cluster` and `ddp_lab.baselines` are the command lines users know.
A short name loads nothing of its own: it hands back the module under tools/, so no tool is ever
loaded twice, and `python -m` runs the tool's own file.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

SHORT = {f"ddp_lab.{t}": f"ddp_lab.tools.{t}" for t in ("bench", "costmodel", "cluster", "baselines", "figures")}


def full_name(name: str) -> str | None:
    """ddp_lab.bench.scaling -> ddp_lab.tools.bench.scaling; None for any other name."""
    for short, full in SHORT.items():
        if name == short or name.startswith(short + "."):
            return full + name[len(short):]
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, full: str):
        self.full = full

    def create_module(self, spec):
        module = importlib.import_module(self.full)
        self.spec = module.__spec__  # the import system sets __spec__ to the short one: put it back
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec

    def get_code(self, name):  # what `python -m ddp_lab.bench.<name>` runs
        return importlib.util.find_spec(self.full).loader.get_code(self.full)

    def is_package(self, name) -> bool:
        return importlib.util.find_spec(self.full).submodule_search_locations is not None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        full = full_name(name)
        spec = importlib.util.find_spec(full) if full else None
        if spec is None:
            return None
        short = importlib.util.spec_from_loader(name, _Loader(full), origin=spec.origin,  # python -m: argv[0]
                                                is_package=spec.submodule_search_locations is not None)
        short.submodule_search_locations = spec.submodule_search_locations
        return short


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # first: before the path finder loads a second copy
