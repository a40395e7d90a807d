"""Every RNG a rank draws from, as plain tensors and lists.

Stored per rank in each checkpoint (rank<R>.pt), so that a resumed run draws
the same random numbers it would have drawn uninterrupted; in a form that
`torch.load(weights_only=True)` accepts (no pickled Python objects).
"""
from __future__ import annotations

import random

import torch


def rng_state(device: torch.device) -> dict:
    """This process's RNG states in a form `torch.load(weights_only=True)` accepts."""
    version, internal, gauss = random.getstate()
    state = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:
        pass
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
