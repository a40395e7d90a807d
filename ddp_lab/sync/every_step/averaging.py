"""What the every-step family (ddp.py, flat.py, per_param.py) shares: averaging 1-D buffers with the
chosen algorithm (sync.algo), in their own dtype or cast for the wire (sync.compress=bf16|fp16)."""
from __future__ import annotations

import torch
from torch import nn

from ddp_lab import tuning
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import ReplicaSync

COMPRESS_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class AveragingSync(ReplicaSync):
    """A ReplicaSync that averages 1-D buffers itself with the chosen algorithm."""

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env)
        self.cfg = cfg
        self.allreduce = tuning.allreduce(cfg.algo, env)  # as this machine runs it
        self.wire_dtype = COMPRESS_DTYPES.get(cfg.compress)  # (powersgd: DDP's hook, ddp.py)

    def _average(self, flat: torch.Tensor) -> None:
        """flat (1-D, contiguous) <- the mean of every rank's flat."""
        n = self.env.world_size
        if self.wire_dtype is None or flat.dtype == self.wire_dtype:  # (int8, int4: DiLoCo's own _send)
            self._average_exact(flat)
        else:
            # Divide first, as PyTorch's compress hooks do: the fp16 sum cannot overflow.
            wire = flat.to(self.wire_dtype).div_(n)
            self.allreduce(wire, self.env.group)
            flat.copy_(wire)
            self.count(wire.numel() * wire.element_size())

    def _average_exact(self, flat: torch.Tensor) -> None:
        """flat <- the mean of every rank's flat, in its own dtype whatever sync.compress says."""
        self.allreduce(flat, self.env.group)
        flat.div_(self.env.world_size)
        self.count(flat.numel() * flat.element_size())

    def describe(self) -> str:
        c = self.cfg.compress
        return f"{self.cfg.mode}/{self.cfg.algo}" + ("" if c == "none" else f"+{c}")
