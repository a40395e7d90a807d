"""`python -m ddp_lab.sync.reference`: every strategy's keys, as docs/configuration.md lists them.

The keys every strategy takes first, then each strategy's own (sync=<name>), in the registry's order, so a new
strategy's keys reach the guide by `make references` alone.
"""
from __future__ import annotations

import dataclasses

from ddp_lab.config.schema import keys_table
from ddp_lab.sync import REGISTRY
from ddp_lab.sync.options import SyncOptions


def reference(level: int = 3) -> str:
    shared = {f.name for f in dataclasses.fields(SyncOptions)}
    lines = keys_table("sync.", SyncOptions, level, "sync.* of every strategy")
    for name, s in REGISTRY.items():
        inside = " (also inside islands: sync/inner=" + name + ", its keys as sync.inner.<key>)" \
            if s.inside is not None else ""
        table = keys_table("sync.", s.options, level, f"sync={name}{inside}", shared)
        lines += table or [f"{'#' * level} sync={name}{inside}", "", "The keys of every strategy only.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
