"""The memory each rank holds for the model: its weights, gradients and optimizer state.

Counted from the tensors' storages, each storage once: a view (flat's and zero's gradients, zero's
shard of the weights, a tied embedding) adds nothing of its own. With AdamW in fp32 one process
holds 16 bytes a parameter (4 weights, 4 gradients, 8 moments); ZeRO stage 1 (sync=zero) holds
8 + 8/N, stage 2 4 + 12/N, stage 3 and fsdp 16/N (between its blocks' gathers). Ranks are not alike under
sharding, so every rank's figure is reported (summary.json's model_state_bytes and
peak_mem_mb_by_rank, lists by rank).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.distributed import DistEnv


def _storages(tensors) -> dict[int, int]:
    """{storage address: its bytes} of the tensors (None and non-tensors skipped)."""
    found = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()  # (fsdp: this rank's rows)
            found[s.data_ptr()] = s.nbytes()
    return found


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync=None) -> dict[str, int]:
    """{"weights", "grads", "optimizer", "sync", "total"}: bytes this process holds, each storage once; "sync":
    what the strategy keeps beside them (sync.state_tensors(): DiLoCo's anchor, outer momentum, residuals)."""
    params = list(model.parameters())
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    weights = _storages(params + opt_params)
    grads = {k: v for k, v in _storages([p.grad for p in params + opt_params]).items() if k not in weights}
    state = _storages(t for s in optimizer.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor) and t.dim() > 0)  # (AdamW's step counter: a scalar)
    state = {k: v for k, v in state.items() if k not in weights and k not in grads}
    kept = _storages(sync.state_tensors()) if sync is not None else {}
    kept = {k: v for k, v in kept.items() if k not in weights and k not in grads and k not in state}
    out = {"weights": sum(weights.values()), "grads": sum(grads.values()), "optimizer": sum(state.values()),
           "sync": sum(kept.values())}
    return {**out, "total": sum(out.values())}


def by_rank(value: float, env: DistEnv) -> list[float]:
    """Every rank's `value`, in rank order (a collective: every rank calls it)."""
    if not env.distributed:
        return [value]
    mine = torch.tensor([float(value)], dtype=torch.float64, device=env.device)
    every = [torch.zeros_like(mine) for _ in range(env.world_size)]
    dist.all_gather(every, mine)
    return [t.item() for t in every]
