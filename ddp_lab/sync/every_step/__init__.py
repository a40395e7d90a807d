"""Every step, the mean of the ranks' gradients: N ranks on N slices of a batch take the step one
process takes on the whole batch, and every rank holds the same weights always.

* ddp.py: torch's DistributedDataParallel (buckets all-reduced during the backward; with
  sync.algo other than builtin, that algorithm inside DDP's communication hook); sync=powersgd:
  powersgd.py's low-rank gradients with error feedback as its hook;
* flat.py: after the backward, one all-reduce per flat buffer that every .grad is a view into;
* per_param.py: after the backward, one all-reduce per parameter, as d2l's chapter does;
* averaging.py: what the three share, averaging a buffer with the chosen algorithm and dtype;
* auto.py: sync=auto, flat on CPU ranks and ddp on GPU ranks.
"""
from __future__ import annotations

from ddp_lab.sync.every_step.auto import AutoOptions
from ddp_lab.sync.every_step.ddp import DDPOptions, DDPSync, PowerSGDOptions
from ddp_lab.sync.every_step.flat import FlatOptions, FlatSync
from ddp_lab.sync.every_step.per_param import PerParamOptions, PerParamSync
from ddp_lab.sync.registry import register

register("auto", AutoOptions, lambda _: FlatSync)  # (resolved() to flat's or ddp's options before it is built)
register("ddp", DDPOptions, DDPSync, inside={})
register("flat", FlatOptions, FlatSync, inside={})
register("per_param", PerParamOptions, PerParamSync)
register("powersgd", PowerSGDOptions, DDPSync)
