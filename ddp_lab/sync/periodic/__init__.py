"""Every sync.every steps, the weights (or their change) travel; in between each rank steps alone,
so the ranks' weights drift apart and each rank's are checkpointed (Capabilities.diverges).

* local_sgd.py: average the weights (post-local SGD after sync.local_sgd_start_step steps);
* diloco.py: average the change in weights and apply it with an outer Nesterov SGD, optionally
  quantized (sync.compress=int8|int4), in the background (sync.overlap) or in fragments;
* diloco_state.py: what a DiLoCo rank checkpoints (anchor, outer momentum, what travels) and how it comes back;
* in_flight.py: an outer gradient on its way (sync.overlap, fragments);
* ft_ddp.py: DDP across torchft islands, the gradients every step (a step a round);
* fragments.py: the runs of parameters DiLoCo's fragments synchronise;
* options.py: their keys (sync.every, sync.islands and the strategy inside them; each one's own).
"""
from __future__ import annotations

from ddp_lab.sync.periodic.diloco import DiLoCoSync
from ddp_lab.sync.periodic.ft_ddp import FTDDPSync
from ddp_lab.sync.periodic.local_sgd import LocalSGDSync
from ddp_lab.sync.periodic.periodic_options import DiLoCoOptions, FTDDPOptions, LocalSGDOptions, PeriodicOptions
from ddp_lab.sync.registry import register

register("local_sgd", LocalSGDOptions, LocalSGDSync)
register("diloco", DiLoCoOptions, DiLoCoSync)
register("ft_ddp", FTDDPOptions, FTDDPSync)

__all__ = ["DiLoCoOptions", "FTDDPOptions", "LocalSGDOptions", "PeriodicOptions"]
