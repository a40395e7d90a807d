"""What the collectives benchmark times, per algorithm: the all-reduces as ddp_lab.tuning gives
them, and all-reduce's two halves (reduce-scatter, all-gather) where an algorithm has them."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from ddp_lab import tuning
from ddp_lab.collectives import (
    TORCH_ALL_GATHER,
    TORCH_REDUCE_SCATTER,
    direct_all_gather,
    direct_reduce_scatter,
    own_chunk,
    ring_textbook_all_gather,
    ring_textbook_reduce_scatter,
)
from ddp_lab.distributed import DistEnv
from ddp_lab.tools.bench.collectives.sweep_plan import Plan
from ddp_lab.tuning import at_comm_priority


def collective_fns(plan: Plan, env: DistEnv) -> dict[str, Callable]:
    """Each algorithm of the plan as `fn(buf)`, as this rank should run it: the
    all-reduces as ddp_lab.tuning.allreduce gives them; reduce_scatter's return
    this rank's chunk of the sum, all_gather's the buffer."""
    if plan.collective == "all_reduce":
        return {a: tuning.allreduce(a, env) for a in plan.algos}
    return {a: _half(plan.collective, a, env) for a in plan.algos}


def _half(collective: str, algo: str, env: DistEnv) -> Callable:
    if algo == "builtin":
        return _builtin_reduce_scatter() if collective == "reduce_scatter" else _builtin_all_gather
    fn = {("reduce_scatter", "ring_textbook"): ring_textbook_reduce_scatter,
          ("all_gather", "ring_textbook"): ring_textbook_all_gather,
          ("reduce_scatter", "direct"): direct_reduce_scatter,
          ("all_gather", "direct"): direct_all_gather}[collective, algo]
    if env.comm_threads != "realtime":
        return fn

    @functools.wraps(fn)
    def at_priority(tensor: torch.Tensor) -> torch.Tensor:  # as tuning.allreduce does
        with at_comm_priority(True):
            return fn(tensor)
    return at_priority


def _builtin_reduce_scatter() -> Callable:
    """dist.reduce_scatter_tensor(SUM) of the whole buffer into an output chunk of its
    own, kept from call to call while the buffer's shape stays (nccl-tests' out of
    place, and how torch's API is used), so no call times an allocation."""
    kept: dict[tuple, torch.Tensor] = {}

    def reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
        shape = (tensor.numel(), tensor.dtype, tensor.device)
        if shape not in kept:
            kept.clear()
            kept[shape] = torch.empty(tensor.numel() // dist.get_world_size(), dtype=tensor.dtype,
                                      device=tensor.device)
        TORCH_REDUCE_SCATTER(kept[shape], tensor, op=dist.ReduceOp.SUM)
        return kept[shape]
    return reduce_scatter


def _builtin_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """dist.all_gather_into_tensor in place: this rank's chunk of the buffer is the input."""
    TORCH_ALL_GATHER(tensor, own_chunk(tensor))
    return tensor
