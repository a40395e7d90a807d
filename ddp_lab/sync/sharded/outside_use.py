"""A parameter read outside its unit's forward, refused in one line (zero stage 3, fsdp).

A unit's weights are whole only inside its module's forward (and its backward): read elsewhere,
say `F.linear(h, self.wte.weight)` by the parent while `wte` is a unit, or `self.a.bias` by the
model's forward, stage 3 reads a freed buffer (torch's "setStorage ... out of bounds", or a
segfault) and fsdp a sharded DTensor, and the gradient of that use would miss the unit's
reduce-scatter. So the first training forward runs under a TorchFunctionMode that looks at every
tensor an op takes: a parameter of a unit whose forward is not running ends the run with a line
naming the parameter, its unit and what to do. Tied and shared parameters (held by two units, or
by the model itself) are in the root unit, whole all the forward, and pass. Later forwards run
without the check (it costs a Python call per op).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ddp_lab.config import ConfigError

ATTRIBUTES = ("__get__", "__set__")


class OutsideUse(TorchFunctionMode):
    """Active over one forward: `owner` (refreshed by the units' hooks) maps each unit parameter's current
    tensor to (its name, its unit's name); `active` the units whose forward is running."""

    def __init__(self, model: nn.Module, units: list[nn.Module]):
        super().__init__()
        self.model, self.units = model, units
        self.unit_names = {id(m): n for n, m in model.named_modules() if any(m is u for u in units)}
        self.active: set[int] = set()
        self.owner: dict[int, tuple[str, str]] = {}

    def refresh(self) -> None:
        """The units' parameters as the model holds them now (fsdp swaps sharded and whole ones in its hooks)."""
        self.owner = {}
        for u in self.units:
            prefix = self.unit_names[id(u)]
            for name, p in u.named_parameters():
                self.owner[id(p)] = (f"{prefix}.{name}", prefix)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ATTRIBUTES:  # .shape, .requires_grad: no weights read
            return func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and id(t) in self.owner:
                name, unit = self.owner[id(t)]
                if not any(self.unit_names[i] == unit for i in self.active):
                    raise ConfigError(
                        f"parameter {name} is read outside the forward of its unit {unit} (by "
                        f"{getattr(func, '__name__', func)}): a sharded unit's weights are whole only inside its "
                        f"own forward; call the module that holds it, or name other modules with "
                        f"sync.shard_units=<classes> so that {unit} is not a unit")
        return func(*args, **(kwargs or {}))


def check_first_forward(model: nn.Module, units: list[nn.Module]) -> None:
    """Hooks that run the model's first training forward under OutsideUse, then remove themselves."""
    mode, hooks, on = OutsideUse(model, units), [], []

    def enter(_m, _args):
        if torch.is_grad_enabled() and not on:
            mode.refresh()
            mode.__enter__()
            on.append(True)

    def leave(_m, _args, _out):  # (always_call: also when the forward raised, so the mode never stays on)
        if on:
            mode.__exit__(None, None, None)
            on.clear()
            for h in hooks:
                h.remove()

    def moved(u, into: bool):
        def hook(_m, *_):
            (mode.active.add if into else mode.active.discard)(id(u))
            mode.refresh()
        return hook

    hooks += [model.register_forward_pre_hook(enter), model.register_forward_hook(leave, always_call=True)]
    for u in units:  # (marked active before the sync's own hooks gather it, inactive after they free it)
        hooks += [u.register_forward_pre_hook(moved(u, True), prepend=True), u.register_forward_hook(moved(u, False))]
