"""The model's weights and optimizer state by parameter name: how a strategy says what its optimizer steps
(optimizer_layout), and how a checkpoint written under another sync mode, or another model file, is read back
a tensor at a time (checkpoint/whole_state.py hands these a Mapping).
"""
from __future__ import annotations

import torch
from torch import nn


def plain_name(name: str) -> str:
    """A parameter's name in the model as built (torch.compile's wrapper prefixes `_orig_mod.`)."""
    return name.replace("_orig_mod.", "")


def param_names(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> its names in the model as built (a tied one has two)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(plain_name(name))
    return names


def layout_of(packs: list[list], model: nn.Module, cut: str) -> list[dict] | None:
    """optimizer_layout's entries: each optimizer parameter's model parameters (`packs`) by [names, shape]; None
    where one is not the model's by name (a strategy that steps copies of its own: it resumes only as itself)."""
    names = param_names(model)
    if any(id(p) not in names for pack in packs for p in pack):
        return None
    return [{"params": [[names[id(p)], list(p.shape)] for p in pack], "cut": cut} for pack in packs]


def weight_of(state, name: str, like: torch.Tensor) -> torch.Tensor:
    """`state[name]`, checked against the model's tensor `like`: ValueError where it is missing or of another shape."""
    if name not in state:
        raise ValueError(f"it holds no {name}")
    t = state[name]
    if t.shape != like.shape:
        raise ValueError(f"its {name} is {list(t.shape)}, this model's {list(like.shape)}")
    return t


def copy_by_name(model: nn.Module, state) -> None:
    """Every tensor of the model's state_dict copied in from `state[name]`, one at a time."""
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            t.copy_(weight_of(state, name, t))


def state_named(by_name, names: list[str]) -> dict:
    """A parameter's optimizer state from `by_name` (a dict or a Mapping read a parameter at a time) under any of
    its names, as it is there; ValueError where none is there."""
    for name in names:
        if name in by_name:
            return by_name[name]
    raise ValueError(f"the checkpoint holds no optimizer state for {names[0]}")


def state_of(by_name, names: list[str]) -> dict:
    """state_named's, its tensors copies of their own (an optimizer steps its step counts in place: two parameters
    must not share one)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state_named(by_name, names).items()}
