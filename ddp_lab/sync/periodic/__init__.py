"""Every sync.every steps, the weights (or their change) travel; in between each rank steps alone,
so the ranks' weights drift apart and each rank's are checkpointed (Capabilities.diverges).

* local_sgd.py: average the weights (post-local SGD after sync.local_sgd_start_step steps); the keys
  every periodic strategy takes (sync.every, sync.islands and the strategy inside them);
* diloco.py: average the change in weights and apply it with an outer Nesterov SGD, optionally
  quantized (sync.compress=int8|int4), in the background (sync.overlap) or in fragments.
"""
from __future__ import annotations

from ddp_lab.sync.periodic.diloco import DiLoCoOptions, DiLoCoSync
from ddp_lab.sync.periodic.local_sgd import LocalSGDOptions, LocalSGDSync, PeriodicOptions
from ddp_lab.sync.registry import register

register("local_sgd", LocalSGDOptions, LocalSGDSync)
register("diloco", DiLoCoOptions, DiLoCoSync)

__all__ = ["DiLoCoOptions", "LocalSGDOptions", "PeriodicOptions"]
