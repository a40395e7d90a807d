"""What the every-step family (ddp.py, flat.py, per_param.py) shares: averaging 1-D buffers with the
chosen algorithm (sync.algo), in their own dtype or cast for the wire (sync.compress=bf16|fp16)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ddp_lab import tuning
from ddp_lab.config.keys import key
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, ReplicaSync, SyncContext
from ddp_lab.sync.options import Cast, SyncOptions

COMPRESS_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class AveragingOptions(SyncOptions):
    """The every-step strategies' keys: what the gradients cross the wire as."""

    compress: Cast = key(Cast.none, "none | bf16 | fp16: the gradients all-reduced in 16 bits (half the bytes), "
                                    "divided by the ranks first")


class AveragingSync(ReplicaSync):
    """A ReplicaSync that averages 1-D buffers itself with the chosen algorithm."""

    name = ""  # sync=<name>, in describe()

    def __init__(self, model: nn.Module, env: DistEnv, cfg: AveragingOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env)
        self.cfg = cfg
        self.allreduce = tuning.allreduce(cfg.algo, env)  # as this machine runs it
        # (local_sgd's synchronous steps, on FlatSync: no cast of their own)
        self.wire_dtype = COMPRESS_DTYPES[cfg.compress] if isinstance(cfg, AveragingOptions) else None

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
        return f"{self.name}/{self.cfg.algo}" + ("" if c == "none" else f"+{c}")
