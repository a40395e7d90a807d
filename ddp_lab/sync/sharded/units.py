"""Which modules zero stage 3 and fsdp gather one at a time (sync.shard_units), for any module tree.

A unit is a module whose forward is called: its weights are gathered in a hook before that forward
and freed after. Parameters no unit holds alone (the model's own, a weight tied between two units,
those of modules left out) form the root unit, gathered for the whole forward and backward.

* `auto` (the default): the model's repeated block class if it has one, at any depth (a GPT's
  `Block`, however deep its `transformer.h` list is nested): a class with two or more instances
  that holds parameters in submodules of its own, not a container (Sequential, ModuleList,
  ModuleDict), the one whose instances hold the most parameters (a Block, not the MLP inside it).
  Without one, by size, as FSDP's size-based wrapping: from the top-level children down, a module
  of at most sync.unit_mb is a unit, a larger one is opened and its children looked at (its own
  parameters join the root); a single layer larger than that stays one unit.
* class names, comma-separated: the outermost modules of those classes.

`describe` says in one line what the units are; `warning` names a unit (root included) that holds
more than half the parameters, which then no rank holds less of than half the model.
"""
from __future__ import annotations

import logging
from collections import Counter

from torch import nn

from ddp_lab.config import ConfigError

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)  # (a ModuleList or ModuleDict has no forward)
AUTO = "auto"
log = logging.getLogger("ddp_lab")


def nbytes(m: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def holds_parameters(m: nn.Module) -> bool:
    return next(m.parameters(), None) is not None


def repeated_block(model: nn.Module) -> type | None:
    """The class of the model's repeated blocks (see the module docstring), or None."""
    counts = Counter(type(m) for m in model.modules() if m is not model and not isinstance(m, CONTAINERS)
                     and any(holds_parameters(c) for c in m.children()))
    held = {cls: sum(nbytes(m) for m in model.modules() if type(m) is cls) for cls, n in counts.items() if n >= 2}
    return max(held, key=held.get) if held else None


def outermost(model: nn.Module, wanted) -> list[nn.Module]:
    """The modules `wanted(m)` picks, none inside another, in the model's order."""
    found, inside = [], set()
    for m in model.modules():
        if m is not model and id(m) not in inside and wanted(m):
            found.append(m)
            inside.update(id(s) for s in m.modules())
    return found


def by_size(model: nn.Module, cap_bytes: float) -> list[nn.Module]:
    """From the top-level children down: a module of at most cap_bytes (or a layer, without children
    holding parameters) is a unit; a larger one, or a ModuleList/ModuleDict, is opened."""
    out = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if not holds_parameters(child):
                continue
            is_list = isinstance(child, (nn.ModuleList, nn.ModuleDict))  # never called: cannot be a unit
            layer = not any(holds_parameters(c) for c in child.children())
            if not is_list and (layer or nbytes(child) <= cap_bytes):
                out.append(child)
            else:
                visit(child)

    visit(model)
    return out


def unit_modules(model: nn.Module, classes: str = AUTO, unit_mb: float = 100.0) -> list[nn.Module]:
    """The modules gathered one at a time (the module docstring's rule), in the model's order."""
    classes = (classes or AUTO).strip()
    if classes == AUTO:
        block = repeated_block(model)
        if block is not None:
            return outermost(model, lambda m: type(m) is block)
        return by_size(model, unit_mb * 2**20)
    names = {c.strip() for c in classes.split(",") if c.strip()}
    found = outermost(model, lambda m: type(m).__name__ in names)
    if not found:
        known = sorted({type(m).__name__ for m in model.modules()})
        raise ConfigError(f"sync.shard_units={classes} names no module of this model: its classes are "
                          f"{', '.join(known)} (or sync.shard_units=auto)")
    return [m for m in found if holds_parameters(m)]


def how_found(model: nn.Module, classes: str, unit_mb: float) -> str:
    classes = (classes or AUTO).strip()
    if classes != AUTO:
        return f"sync.shard_units={classes}"
    block = repeated_block(model)
    return f"auto: the repeated {block.__name__}" if block else f"auto: by size, at most {unit_mb:g} MB"


def describe(model: nn.Module, units: list[nn.Module], classes: str = AUTO, unit_mb: float = 100.0) -> str:
    """One line: how the units were found, how many of what size, and the root's size and modules."""
    names = {id(m): n for n, m in model.named_modules()}
    sizes = [nbytes(m) for m in units]
    in_units = {id(p) for m in units for p in m.parameters()}
    root = sum(p.numel() * p.element_size() for p in set(model.parameters()) if id(p) not in in_units)
    kinds = Counter(type(m).__name__ for m in units)
    what = ", ".join(f"{n} x {k}" for k, n in kinds.most_common(4)) + (", ..." if len(kinds) > 4 else "")
    span = (f"{min(sizes) / 2**20:.2f}-{max(sizes) / 2**20:.2f} MB" if sizes and min(sizes) != max(sizes)
            else f"{sizes[0] / 2**20:.2f} MB each" if sizes else "none")
    first = ", ".join(names[id(m)] for m in units[:3]) + (", ..." if len(units) > 3 else "")
    return (f"units ({how_found(model, classes, unit_mb)}): {len(units)} ({what}; {span}; {first}), "
            f"root {root / 2**20:.2f} MB")


def warning(model: nn.Module, units: list[nn.Module]) -> str:
    """A line naming the unit that holds more than half the parameters, or ""."""
    names = {id(m): n for n, m in model.named_modules()}
    total = sum(p.numel() for p in set(model.parameters()))
    in_units = {id(p) for m in units for p in m.parameters()}
    parts = [(names[id(m)], sum(p.numel() for p in m.parameters())) for m in units]
    parts.append(("the root (parameters outside every unit)",
                  sum(p.numel() for p in set(model.parameters()) if id(p) not in in_units)))
    name, most = max(parts, key=lambda x: x[1])
    if total == 0 or most * 2 <= total:
        return ""
    return (f"unit {name} holds {100 * most / total:.0f}% of the parameters and is gathered whole: name smaller "
            f"modules with sync.shard_units=<classes>, or lower sync.unit_mb")


def announce(model: nn.Module, units: list[nn.Module], cfg, is_main: bool) -> None:
    """Rank 0 logs the units (describe) and, where one holds more than half the parameters, warns."""
    if not is_main:
        return
    log.info(describe(model, units, cfg.shard_units, cfg.unit_mb))
    if line := warning(model, units):
        log.warning(line)
