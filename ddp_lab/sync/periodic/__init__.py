"""Every sync.every steps, the weights (or their change) travel; in between each rank steps alone,
so the ranks' weights drift apart and each rank's are checkpointed (Capabilities.diverges).

* local_sgd.py: average the weights (post-local SGD after sync.local_sgd_start_step steps);
* diloco.py: average the change in weights and apply it with an outer Nesterov SGD, optionally
  quantized (sync.compress=int8|int4), in the background (sync.overlap) or in fragments.
"""
from __future__ import annotations

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.config import ConfigError
from ddp_lab.sync.periodic.diloco import DiLoCoSync
from ddp_lab.sync.periodic.local_sgd import LocalSGDSync

STRATEGIES = {"local_sgd": LocalSGDSync, "diloco": DiLoCoSync}


def _diloco_only(cfg, key: str, value, does: str) -> None:
    if value and (cfg.mode != "diloco" or cfg.algo != "builtin"):
        raise ConfigError(f"sync.{key}={value} {does} on torch's collectives: it takes sync.mode=diloco and "
                          f"sync.algo=builtin, not sync.mode={cfg.mode} sync.algo={cfg.algo}")


def validate(cfg) -> None:
    """This family's rules on the sync group's keys (and the options only DiLoCo has)."""
    _diloco_only(cfg, "compress", cfg.compress if cfg.compress in QUANTIZED else None,
                 "sends DiLoCo's outer gradients")
    _diloco_only(cfg, "overlap", cfg.overlap, "sends DiLoCo's outer gradient in the background")
    _diloco_only(cfg, "fragments", cfg.fragments if cfg.fragments > 1 else None, "staggers DiLoCo's outer syncs")
    _diloco_only(cfg, "overlap_update", cfg.overlap_update if cfg.overlap_update != "delayed" else None,
                 "takes DiLoCo's outer step before its mean lands")
    if getattr(cfg, "eager_proxy", "local") != "local" and cfg.overlap_update != "eager":
        raise ConfigError(f"sync.eager_proxy={cfg.eager_proxy} is what eager's outer step stands on, and "
                          f"sync.overlap_update={cfg.overlap_update}: set sync.overlap_update=eager, or leave "
                          f"sync.eager_proxy out")
    if cfg.overlap_update == "eager" and not cfg.overlap:
        raise ConfigError("sync.overlap_update=eager takes the outer step before the mean lands, and sync.overlap=0 "
                          "waits for it: set sync.overlap to 1 or more (e.g. 2), or leave sync.overlap_update out")
    if cfg.fragments > 1 and cfg.fragments > cfg.every:
        raise ConfigError(f"sync.fragments={cfg.fragments} must be at most sync.every={cfg.every}: each fragment "
                          f"synchronises at its own step of the {cfg.every}")
    if cfg.overlap and cfg.overlap >= cfg.every:
        raise ConfigError(f"sync.overlap={cfg.overlap} must be less than sync.every={cfg.every}: the outer step "
                          f"lands before the next synchronisation")
    if cfg.mode == "local_sgd" and cfg.compress != "none":
        raise ConfigError(f"sync.compress={cfg.compress} with sync.mode=local_sgd would round the weights "
                          f"themselves: use sync.compress=none, or sync.mode=diloco (which sends changes "
                          f"of the weights)")
