"""Every step, the mean of the ranks' gradients: N ranks on N slices of a batch take the step one
process takes on the whole batch, and every rank holds the same weights always.

* ddp.py: torch's DistributedDataParallel (buckets all-reduced during the backward; with
  sync.algo other than builtin, that algorithm inside DDP's communication hook; powersgd.py's
  low-rank gradients with error feedback as its hook);
* flat.py: after the backward, one all-reduce per flat buffer that every .grad is a view into;
* per_param.py: after the backward, one all-reduce per parameter, as d2l's chapter does;
* averaging.py: what the three share, averaging a buffer with the chosen algorithm and dtype.
"""
from __future__ import annotations

from ddp_lab.config import ConfigError
from ddp_lab.sync.every_step.ddp import DDPSync
from ddp_lab.sync.every_step.flat import FlatSync
from ddp_lab.sync.every_step.per_param import PerParamSync

STRATEGIES = {"ddp": DDPSync, "flat": FlatSync, "per_param": PerParamSync}


def validate(cfg) -> None:
    """This family's rules on the sync group's keys."""
    if cfg.mode in ("ddp", "auto") and cfg.bucket_cap_mb <= 0:
        raise ConfigError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb} must be > 0 with "
                          f"sync.mode={cfg.mode}")
    if cfg.compress == "powersgd" and (cfg.mode not in ("ddp", "auto") or cfg.algo != "builtin"):
        raise ConfigError(f"sync.compress=powersgd runs as torch's DDP communication hook: it takes "
                          f"sync.mode=ddp (or auto) and sync.algo=builtin, not sync.mode={cfg.mode} "
                          f"sync.algo={cfg.algo}")
