"""The model state sharded over the ranks (docs/memory.md): each rank steps its own shard and
keeps 1/N of the optimizer state (stage 1), also of the gradients (stage 2), also of the weights
(stage 3 and fsdp, which gather a unit's weights before its forward and backward and free them
after).

* zero1.py: ZeRO stage 1, and the layout, schedule and all-gather stages 2 and 3 build on;
* zero2.py: stage 2, zero1's with the gradients reduce-scattered and dropped;
* zero3.py: stage 3, zero2's with the weights in units gathered one at a time;
* flat_unit.py: a unit's weights as stage 3 holds them, flat buffers by kind and this rank's pieces;
* fsdp.py: torch's FSDP2 (fully_shard) on the same units;
* units.py: which modules stage 3 and fsdp gather one at a time, for any module tree;
* outside_use.py: a parameter read outside its unit's forward, refused in one line;
* grad_scaler.py: trainer.amp=fp16's loss scaler, skipping a step on every rank or none;
* common.py: what they share (flat views, clipping over shards, freed memory).
"""
from __future__ import annotations

from ddp_lab.config import ConfigError
from ddp_lab.sync.sharded.common import ALGOS
from ddp_lab.sync.sharded.fsdp import FSDPSync
from ddp_lab.sync.sharded.zero1 import Zero1Sync
from ddp_lab.sync.sharded.zero2 import Zero2Sync
from ddp_lab.sync.sharded.zero3 import Zero3Sync

ZERO_STAGES = {1: Zero1Sync, 2: Zero2Sync, 3: Zero3Sync}
STRATEGIES = {"zero": lambda cfg: ZERO_STAGES[cfg.zero_stage], "fsdp": FSDPSync}


def validate(cfg) -> None:
    """This family's rules on the sync group's keys."""
    if cfg.mode not in STRATEGIES:
        return
    if cfg.mode == "fsdp" and cfg.algo != "builtin":
        raise ConfigError(f"sync.algo={cfg.algo} cannot run inside torch's FSDP2: sync.mode=fsdp takes "
                          f"sync.algo=builtin (sync.mode=zero runs ring_textbook and direct)")
    if cfg.algo not in ALGOS:
        raise ConfigError(f"sync.algo={cfg.algo} has no reduce-scatter and all-gather of its own: sync.mode=zero "
                          f"takes sync.algo={' or '.join(ALGOS)}")
    if cfg.compress != "none":
        raise ConfigError(f"sync.compress={cfg.compress} is not built for sync.mode={cfg.mode}: use sync.compress=none")
