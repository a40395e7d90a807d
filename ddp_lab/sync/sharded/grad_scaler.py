"""trainer.amp=fp16 under zero and fsdp: the loss scaler must skip a step on every rank or on none.

torch's GradScaler looks for an inf or NaN in the gradients this rank's optimizer steps. Under zero and
fsdp that is this rank's shard only: after an overflow in another rank's shard, that rank skips the
step and halves its scale while this one steps and keeps its own, and from there the ranks' weights and
scales differ. ShardedGradScaler ORs the finding over the ranks (one all-reduce of a flag in unscale_,
as torch's FSDP ShardedGradScaler does), so every rank skips, and every scale moves alike.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class ShardedGradScaler(torch.amp.GradScaler):
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if not self._enabled or not dist.is_initialized():
            return
        found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        flag = torch.zeros(1, dtype=torch.float32, device=self._scale.device)
        for v in found.values():
            flag += v.to(flag.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # (1: some rank's shard overflowed)
        if not found:  # (a rank stepping nothing: its finding still counts in step() and update())
            found[self._scale.device] = torch.zeros((), dtype=torch.float32, device=self._scale.device)
        for v in found.values():
            v.copy_(flag.to(v.device).reshape(v.shape))
