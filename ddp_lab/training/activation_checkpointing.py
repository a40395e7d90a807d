"""trainer.activation_checkpointing: keep a unit's inputs, not its activations, and recompute its forward
in the backward (torch.utils.checkpoint, use_reentrant=False), trading a forward's compute for memory.

The units are the sharded modes' (sync/sharded/units.py: the repeated block, else by size), in every
sync mode: `units` checkpoints each, `every_<k>` (every_2) every k-th, `none` nothing. Under zero stage
3 and fsdp the recompute runs inside the unit's backward, after the hook that gathers the unit's
weights again, so it reads them whole; nothing else changes. Applied before the sync wraps the model,
by overriding each chosen module's forward (its state_dict names stay as they were).
"""
from __future__ import annotations

import re
import types

from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp_lab.config import ConfigError
from ddp_lab.sync.sharded.units import unit_modules

EVERY = re.compile(r"^every_([1-9][0-9]*)$")


def parse(how: str) -> int:
    """The k of every k-th unit checkpointed (units: 1), 0 for none; one line for anything else."""
    how = str(how).strip().lower()
    if how in ("none", "false", "off"):
        return 0
    if how == "units":
        return 1
    found = EVERY.match(how)
    if not found:
        raise ConfigError(f"trainer.activation_checkpointing={how} is not one of none, units, every_<k> "
                          f"(e.g. every_2: every second unit)")
    return int(found.group(1))


def _checkpointed_forward(self, *args, **kwargs):
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def chosen(model: nn.Module, how: str, shard_units: str = "auto", unit_mb: float = 100.0) -> list[nn.Module]:
    """The modules trainer.activation_checkpointing=`how` checkpoints: every k-th unit (none: [])."""
    k = parse(how)
    return unit_modules(model, shard_units, unit_mb)[::k] if k else []


def apply(model: nn.Module, how: str, shard_units: str = "auto", unit_mb: float = 100.0) -> list[nn.Module]:
    """Checkpoint the chosen modules (their forward recomputed in the backward); the modules it did."""
    modules = chosen(model, how, shard_units, unit_mb)
    for m in modules:
        m.forward = types.MethodType(_checkpointed_forward, m)  # (a deepcopy binds it to the copy)
    return modules
