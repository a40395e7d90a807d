"""Gradient synchronisation strategies: how every rank ends a step with the same gradient.

`build_sync(cfg.sync, model, env)` returns a ReplicaSync (base.py lists what the
trainer calls: `sync.module(x)` for the forward pass, `during_backward()`
around each micro-batch, `after_backward()` before the optimizer step,
`after_step()` where weights travel, `consensus()` around an evaluation, and
a few more). Its name says gradients, but local_sgd and diloco move weights.
Config keys choose the strategy:

``sync.mode`` -- *when* and *in what pieces* gradients travel (``auto``, the
default: flat on CPU ranks, ddp on GPU ranks; see resolve_mode), one file each:

* ``ddp`` (ddp.py): torch DistributedDataParallel. Gradients are grouped into
  buckets of ``bucket_cap_mb`` during backward, and each bucket is all-reduced
  as soon as all its gradients exist, overlapping communication with the rest
  of the backward pass. With ``algo`` other than builtin, that algorithm
  reduces each bucket inside a DDP communication hook, so bucketing and
  overlap are kept.
* ``flat`` (flat.py): after backward, every gradient lives in one persistent
  flat buffer (or buckets of ``bucket_cap_mb``; 0 means one buffer); each
  param's ``.grad`` is a view into it, so nothing is copied. One allreduce per
  buffer.
* ``per_param`` (per_param.py): after backward, one allreduce per parameter,
  as in d2l's from-scratch chapter: many small messages, each paying the
  latency.

``sync.algo`` -- *how* a buffer is all-reduced: ``builtin``
(``dist.all_reduce``: gloo or NCCL) or one of ddp_lab.collectives' point-to-
point algorithms: ``ring_textbook`` and ``halving_doubling_textbook`` as the
textbook writes them, ``ring`` and ``halving_doubling`` tuned for speed,
``naive``, and ``direct`` (every chunk straight to its owner: the one whose two
halves sync.mode=zero runs in the background).

``sync.compress`` -- ``none``, or ``bf16`` / ``fp16``: the buffer is cast to
the 16-bit type and divided by the world size, that is all-reduced (half the
bytes on the wire), and the sum is cast back. For mode=ddp algo=builtin this is
PyTorch's own ``bf16_compress_hook`` / ``fp16_compress_hook``. ``powersgd``:
low-rank gradients with error feedback, torch's hook under DDP (powersgd.py;
mode=auto becomes ddp, and another mode or algo is refused). ``int8`` /
``int4``: DiLoCo's outer gradients quantized per block and summed in fp32
(ddp_lab/collectives/quantized.py; mode=diloco only).

Every mode above averages: the result is the mean of the ranks' gradients, so
that N ranks on N slices of a batch take the step one process takes on the
batch. Two modes send weights instead, every ``sync.every`` steps, and let
the ranks drift apart in between (docs/bandwidth.md compares all of them):

* ``local_sgd`` (local_sgd.py): average the weights (post-local SGD: after
  ``sync.local_sgd_start_step`` synchronous steps).
* ``diloco`` (diloco.py): average the change in weights and apply it with an
  outer Nesterov SGD.

Two modes shard the model state over the ranks (docs/memory.md): ``zero`` (ours, ZeRO stages
1-3 by ``sync.zero_stage``: zero.py, zero2.py, zero3.py) and ``fsdp`` (torch's FSDP2: fsdp.py).

Every strategy counts the bytes it hands to all-reduces (``wire_bytes``).

``sync.poll`` (how a CPU rank waits for the builtin allreduce, decided at
start-up by ddp_lab.tuning and read from ``env.poll``) and the communication
time each strategy reports are explained in base.py, which every strategy
builds on.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from ddp_lab.collectives import ALGORITHMS
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import COMPRESS_DTYPES, QUANTIZED, ReplicaSync
from ddp_lab.sync.ddp import DDPSync
from ddp_lab.sync.diloco import DiLoCoSync
from ddp_lab.sync.flat import FlatSync
from ddp_lab.sync.fsdp import FSDPSync
from ddp_lab.sync.local_sgd import LocalSGDSync
from ddp_lab.sync.per_param import PerParamSync
from ddp_lab.sync.shards import ALGOS as ZERO_ALGOS
from ddp_lab.sync.zero import ZeroSync
from ddp_lab.sync.zero2 import Zero2Sync
from ddp_lab.sync.zero3 import Zero3Sync

STRATEGIES = {"ddp": DDPSync, "flat": FlatSync, "per_param": PerParamSync,
              "local_sgd": LocalSGDSync, "diloco": DiLoCoSync, "zero": ZeroSync, "fsdp": FSDPSync}
MODES = ("ddp", "flat", "per_param")  # the modes that average every step's gradients
PERIODIC = ("local_sgd", "diloco")  # the modes that send weights every sync.every steps
SHARDED = ("zero", "fsdp")  # the modes that shard the model state over the ranks
ALGOS = tuple(ALGORITHMS)  # builtin, naive, ring, halving_doubling, ring_textbook, halving_doubling_textbook, direct
COMPRESS = (*COMPRESS_DTYPES, "powersgd", *QUANTIZED)  # none, bf16, fp16, powersgd, int8, int4


def resolve_mode(mode: str, device: torch.device) -> str:
    """sync.mode=auto: flat on CPU ranks, ddp on GPU ranks.

    On CPU, LeNet on 2 ranks trained 3-14% faster with flat than with ddp in
    each of 12 alternating pairs of runs on the 2-core development machine
    (both polling): a small model's gradients fit one DDP bucket, so DDP has
    no overlap to offer, only its bookkeeping. On GPUs DDP's buckets overlap
    the allreduce with the backward, which is what larger models need.
    """
    if mode != "auto":
        return mode
    return "ddp" if device.type == "cuda" else "flat"


def resolved_mode(cfg, device: torch.device) -> str:
    """resolve_mode, but compress=powersgd needs DDP's hook: auto is ddp then."""
    return "ddp" if cfg.mode == "auto" and cfg.compress == "powersgd" else resolve_mode(cfg.mode, device)


def validate(cfg) -> None:
    """Refuse what the schema cannot see alone (identically on every rank, before any traffic)."""
    if cfg.mode in ("ddp", "auto") and cfg.bucket_cap_mb <= 0:
        raise ConfigError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb} must be > 0 with "
                          f"sync.mode={cfg.mode}")
    if cfg.compress == "powersgd" and (cfg.mode not in ("ddp", "auto") or cfg.algo != "builtin"):
        raise ConfigError(f"sync.compress=powersgd runs as torch's DDP communication hook: it takes "
                          f"sync.mode=ddp (or auto) and sync.algo=builtin, not sync.mode={cfg.mode} "
                          f"sync.algo={cfg.algo}")
    if cfg.mode in SHARDED:
        validate_zero(cfg)
    if cfg.compress in QUANTIZED and (cfg.mode != "diloco" or cfg.algo != "builtin"):
        raise ConfigError(f"sync.compress={cfg.compress} sends DiLoCo's outer gradients on torch's collectives: it "
                          f"takes sync.mode=diloco and sync.algo=builtin, not sync.mode={cfg.mode} "
                          f"sync.algo={cfg.algo}")
    if cfg.overlap and (cfg.mode != "diloco" or cfg.algo != "builtin"):
        raise ConfigError(f"sync.overlap={cfg.overlap} sends DiLoCo's outer gradient in the background on torch's "
                          f"collectives: it takes sync.mode=diloco and sync.algo=builtin, not sync.mode={cfg.mode} "
                          f"sync.algo={cfg.algo}")
    if cfg.fragments > 1 and (cfg.mode != "diloco" or cfg.algo != "builtin"):
        raise ConfigError(f"sync.fragments={cfg.fragments} staggers DiLoCo's outer syncs on torch's collectives: it "
                          f"takes sync.mode=diloco and sync.algo=builtin, not sync.mode={cfg.mode} "
                          f"sync.algo={cfg.algo}")
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


ZERO_STAGES = {1: ZeroSync, 2: Zero2Sync, 3: Zero3Sync}


def validate_zero(cfg) -> None:
    if cfg.mode == "fsdp" and cfg.algo != "builtin":
        raise ConfigError(f"sync.algo={cfg.algo} cannot run inside torch's FSDP2: sync.mode=fsdp takes "
                          f"sync.algo=builtin (sync.mode=zero runs ring_textbook and direct)")
    if cfg.algo not in ZERO_ALGOS:
        raise ConfigError(f"sync.algo={cfg.algo} has no reduce-scatter and all-gather of its own: sync.mode=zero "
                          f"takes sync.algo={' or '.join(ZERO_ALGOS)}")
    if cfg.compress != "none":
        raise ConfigError(f"sync.compress={cfg.compress} is not built for sync.mode={cfg.mode}: use sync.compress=none")


def eager_only(cfg) -> str:
    """Why the model must run eagerly under this sync ("" where it need not)."""
    if cfg.mode == "zero" and cfg.zero_stage == 3:
        return "sync.zero_stage=3 gathers and frees the weights in module hooks that resize their storage"
    if cfg.mode == "fsdp":
        return "sync.mode=fsdp applies fully_shard to the eager model's blocks"
    return ""


def build_sync(cfg, model: nn.Module, env: DistEnv) -> ReplicaSync:
    validate(cfg)
    if not env.distributed:
        return ReplicaSync(model, env)
    mode = resolved_mode(cfg, env.device)
    if mode != cfg.mode:  # the strategies read cfg.mode (describe() reports it)
        items = vars(cfg) if isinstance(cfg, SimpleNamespace) else dict(cfg)
        cfg = SimpleNamespace(**{**items, "mode": mode})
    return (ZERO_STAGES[cfg.zero_stage] if mode == "zero" else STRATEGIES[mode])(model, env, cfg)
