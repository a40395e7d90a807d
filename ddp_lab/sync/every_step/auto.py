"""sync=auto (the default): flat on CPU ranks, ddp on GPU ranks.

Why: a small model's gradients fit one DDP bucket, so on CPU DDP has no overlap to offer, only its bookkeeping,
and flat's one buffer trained LeNet faster; a larger model's fill several of flat's buffers, each all-reduced as
the backward fills it, as DDP's buckets are (the GPT level with a plain DDP loop: docs/defaults.md). On GPUs,
DDP, what production jobs run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ddp_lab.sync.every_step.averaging import AveragingOptions
from ddp_lab.sync.every_step.ddp import DDPOptions
from ddp_lab.sync.every_step.flat import FlatOptions


@dataclass
class AutoOptions(AveragingOptions):
    """The keys flat and ddp share; each other key at the chosen strategy's default."""

    def resolved(self, device: torch.device) -> AveragingOptions:
        chosen = DDPOptions if device.type == "cuda" else FlatOptions
        return chosen(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
