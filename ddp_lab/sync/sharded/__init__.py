"""The model state sharded over the ranks (docs/memory.md): each rank steps its own shard and
keeps 1/N of the optimizer state (stage 1), also of the gradients (stage 2), also of the weights
(stage 3 and fsdp, which gather a unit's weights before its forward and backward and free them
after).

* zero1.py: ZeRO stage 1, and the layout, schedule and all-gather stages 2 and 3 build on; sync=zero's keys;
* zero2.py: stage 2, zero1's with the gradients reduce-scattered and dropped;
* zero3.py: stage 3, zero2's with the weights in units gathered one at a time;
* zero3_state.py: stage 3's weights out (model.pt, checkpoints) and back in (any world size), never whole;
* flat_unit.py: a unit's weights as stage 3 holds them, flat buffers by kind and this rank's pieces;
* fsdp.py: torch's FSDP2 (fully_shard) on the same units; sync.islands makes it HSDP;
* units.py: which modules stage 3 and fsdp gather one at a time, for any module tree;
* outside_use.py: a parameter read outside its unit's forward, refused in one line;
* grad_scaler.py: trainer.amp=fp16's loss scaler, skipping a step on every rank or none;
* common.py: what they share (flat views, clipping over shards, freed memory, the keys of stage 3 and fsdp).
"""
from __future__ import annotations

from ddp_lab.sync.registry import register
from ddp_lab.sync.sharded.fsdp import FSDPOptions, FSDPSync
from ddp_lab.sync.sharded.zero1 import Zero1Sync, ZeroOptions
from ddp_lab.sync.sharded.zero2 import Zero2Sync
from ddp_lab.sync.sharded.zero3 import Zero3Sync

ZERO_STAGES = {1: Zero1Sync, 2: Zero2Sync, 3: Zero3Sync}

register("zero", ZeroOptions, ZeroOptions.strategy, inside={"algo": "builtin"})  # (torch's collectives on an island)
register("fsdp", FSDPOptions, FSDPSync, inside={})
