"""Gradient synchronisation strategies: how every rank ends a step with the same gradient.

`build_sync(cfg.sync, model, env)` returns a GradSync. The trainer only ever
calls `sync.module(x)` for the forward pass, `sync.no_sync()` around
micro-batches that must not communicate, and `sync.after_backward()` before
the optimizer step. Two config keys choose the strategy:

``sync.mode`` -- *when* and *in what pieces* gradients travel (``auto``, the
default: flat on CPU ranks, ddp on GPU ranks; see resolve_mode):

* ``ddp``: torch DistributedDataParallel. Gradients are grouped into buckets
  of ``bucket_cap_mb`` during backward, and each bucket is all-reduced as soon
  as all its gradients exist, overlapping communication with the rest of the
  backward pass. With ``algo`` other than builtin, that algorithm reduces each
  bucket inside a DDP communication hook, so bucketing and overlap are kept.
* ``flat``: after backward, every gradient lives in one persistent flat
  buffer (or buckets of ``bucket_cap_mb``; 0 means one buffer); each param's
  ``.grad`` is a view into it, so nothing is copied. One allreduce per buffer.
* ``per_param``: after backward, one allreduce per parameter, as in d2l's
  from-scratch chapter: many small messages, each paying the latency.

``sync.algo`` -- *how* a buffer is all-reduced: ``builtin``
(``dist.all_reduce``: gloo or NCCL) or one of ddp_lab.collectives' point-to-
point algorithms (``naive``, ``ring``, ``halving_doubling``).

``sync.compress`` -- ``none``, or ``bf16`` / ``fp16``: the buffer is cast to
the 16-bit type and divided by the world size, that is all-reduced (half the
bytes on the wire), and the sum is cast back. For mode=ddp algo=builtin this is
PyTorch's own ``bf16_compress_hook`` / ``fp16_compress_hook``.

Every mode averages: the result is the mean of the ranks' gradients, so that N
ranks on N slices of a batch take the step one process takes on the batch.

``sync.poll`` -- how a CPU rank waits for the backend's own allreduce
(algo=builtin): by asking whether it is done, yielding the CPU between
questions (``os.sched_yield``), instead of sleeping until gloo wakes it. A
rank that sleeps there is now and then woken milliseconds late: on the 2-core
development VM a 0.5 MB gloo allreduce took a median 0.45 ms back to back,
but a median 2.1 ms (3.9 ms or more one time in four) right after 20 ms of
computing. Polling made 2 ranks of LeNet train 10% faster there with
mode=flat (3 alternating runs each); with mode=ddp the difference was within
the noise. (Most of that lateness was gloo's own threads waiting for a
scheduler tick, which dist.comm_threads now removes where permitted; with
it, polling still gave the shorter comm_ms in 2 of 3 pairs.) With mode=ddp
it waits on the backward's last bucket only, so earlier buckets still
overlap the backward. CUDA ranks never poll: NCCL's wait does not block the
host.
Our own algorithms always block: gloo's send/recv works cannot be asked.

Communication time (``comm_seconds``, ``comm_timing``):

* ``after_backward`` (flat, per_param): the wall time of after_backward.
* ``hook`` (ddp with algo != builtin): the time spent inside the hook. The
  hooks run while backward is still computing other buckets' gradients, so
  this is an upper bound of the communication cost the step actually sees.
* ``unmeasured`` (ddp with algo=builtin, any compress): DDP's allreduce is
  asynchronous; timing it would mean waiting for it inside the hook, which
  removes the very overlap being measured. No figure is reported (null).
* ``none``: a single process, nothing to communicate (0).

On CUDA the time is taken with CUDA events around the work on the current
stream (no extra synchronisation), read when ``comm_seconds`` is read. Only
steps taken while ``measuring`` is true count; the trainer sets it for the
steps its throughput window counts.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_lab.collectives import ALGORITHMS
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv

MODES = ("ddp", "flat", "per_param")
ALGOS = tuple(ALGORITHMS)  # builtin, naive, ring, halving_doubling
COMPRESS = ("none", "bf16", "fp16")
COMPRESS_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# DDP's first bucket, kept small so that the first allreduce starts early.
DDP_FIRST_BUCKET_BYTES = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)

log = logging.getLogger("ddp_lab")


class GradSync:
    """No communication at all: a single process, or the base of the others."""

    comm_timing = "none"  # see the module docstring
    # False where .grad must stay allocated between steps (flat: views into its buffer),
    # so the trainer calls zero_grad(set_to_none=grads_set_to_none).
    grads_set_to_none = True

    def __init__(self, model: nn.Module, env: DistEnv):
        self.model = model
        self.module: nn.Module = model
        self.env = env
        self.measuring = True  # count communication time of the current step
        self.wire_bytes = 0  # bytes ddp_lab itself handed to an allreduce (not DDP's builtin)
        self._seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @property
    def comm_seconds(self) -> float:
        """Time in gradient communication, summed over the measured steps."""
        if self._events:
            for start, end in self._events:
                end.synchronize()
                self._seconds += start.elapsed_time(end) / 1000
            self._events.clear()
        return self._seconds

    def comm_figures(self, steps: int, seconds: float) -> tuple[float, float]:
        """(ms of communication per step, its share of the step time) over `steps`
        measured steps that took `seconds`; NaN where not measured."""
        if self.comm_timing == "unmeasured" or steps == 0:
            return math.nan, math.nan
        comm = self.comm_seconds
        return 1000 * comm / steps, (comm / seconds if seconds > 0 else math.nan)

    @contextlib.contextmanager
    def _timed(self):
        """Add the enclosed communication to comm_seconds (when measuring)."""
        if not self.measuring:
            yield
            return
        if self.env.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._seconds += time.perf_counter() - t0

    def no_sync(self):
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        pass

    def describe(self) -> str:
        return "none"


def wait_polling(done) -> None:
    """Return once done() is true, yielding the CPU between checks but never sleeping."""
    while not done():
        os.sched_yield()


def polling_allreduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """dist.all_reduce(SUM) that waits by polling (see sync.poll above)."""
    if dist.get_world_size(group) > 1:
        work = dist.all_reduce(tensor, group=group, async_op=True)
        wait_polling(work.is_completed)
        work.wait()  # raises what the allreduce raised, if anything
    return tensor


def _polls(cfg, env: DistEnv) -> bool:
    """Whether this rank waits for the builtin allreduce by polling (sync.poll)."""
    return cfg.poll and cfg.algo == "builtin" and env.device.type == "cpu"


def _polling_hook(hook):
    """A DDP comm hook that waits for the backward's last bucket by polling.

    DDP waits for every bucket's future when the backward ends; the last
    bucket is the one still in flight then, so polling it is where the wait is.
    """
    def polling(state, bucket):
        fut = hook(state, bucket)
        if bucket.is_last():
            wait_polling(fut.done)
        return fut
    return polling


class _Averaging(GradSync):
    """A GradSync that averages 1-D buffers itself with the chosen algorithm."""

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env)
        self.cfg = cfg
        self.allreduce = polling_allreduce if _polls(cfg, env) else ALGORITHMS[cfg.algo]
        self.wire_dtype = COMPRESS_DTYPES[cfg.compress]

    def _average(self, flat: torch.Tensor) -> None:
        """flat (1-D, contiguous) <- the mean of every rank's flat."""
        n = self.env.world_size
        if self.wire_dtype is None or flat.dtype == self.wire_dtype:
            self.allreduce(flat)
            flat.div_(n)
            self.wire_bytes += flat.numel() * flat.element_size()
        else:
            # Divide first, as PyTorch's compress hooks do: the fp16 sum cannot overflow.
            wire = flat.to(self.wire_dtype).div_(n)
            self.allreduce(wire)
            flat.copy_(wire)
            self.wire_bytes += wire.numel() * wire.element_size()

    def describe(self) -> str:
        c = self.cfg.compress
        return f"{self.cfg.mode}/{self.cfg.algo}" + ("" if c == "none" else f"+{c}")


class DDPSync(_Averaging):
    """torch DistributedDataParallel: bucketed allreduce overlapped with backward.

    algo=builtin leaves the reduction to DDP (with compress, PyTorch's own
    bf16/fp16 compress hook); any other algo runs in a communication hook on
    each bucket, synchronously, and hands DDP a completed future.
    """

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg)
        if _is_compiled(model) and cfg.bucket_cap_mb * 2**20 < DDP_FIRST_BUCKET_BYTES:
            _compile_whole_graph_under_ddp(cfg.bucket_cap_mb)
        self.module = DDP(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
        )
        if cfg.algo == "builtin":
            self.comm_timing = "unmeasured"
            hook = None
            if cfg.compress != "none":
                torch_hook = {"bf16": default_hooks.bf16_compress_hook,
                              "fp16": default_hooks.fp16_compress_hook}[cfg.compress]

                def hook(state, bucket):  # counts bytes, never waits
                    self.wire_bytes += bucket.buffer().numel() * 2
                    return torch_hook(state, bucket)
            if _polls(cfg, env):
                hook = _polling_hook(hook or default_hooks.allreduce_hook)
            if hook is not None:
                self.module.register_comm_hook(None, hook)
        else:
            self.comm_timing = "hook"
            self.module.register_comm_hook(None, self._hook)

    def _hook(self, state, bucket):  # (no annotations: DDP checks them, and they are strings here)
        buffer = bucket.buffer()
        with self._timed():
            self._average(buffer)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    def no_sync(self):
        return self.module.no_sync()


def _is_compiled(model: nn.Module) -> bool:
    # No torch.compile without torch._dynamo loaded: do not pay for importing it here.
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def _compile_whole_graph_under_ddp(bucket_cap_mb: float) -> None:
    """Let a compiled model train under DDP buckets smaller than DDP's first one.

    torch.compile cuts the model's graph at DDP's bucket boundaries, so that each
    bucket's allreduce starts while the rest of the backward runs; that pass
    (torch._dynamo.config.optimize_ddp) assumes no bucket is smaller than DDP's
    first (1 MiB) and fails with "First bucket should be smaller/equal to other
    buckets" when one is. Compiling the whole graph instead is correct; the
    price is that every bucket's allreduce starts after the backward ends.
    The setting is process-wide: one training run per process.
    """
    log.warning("sync.bucket_cap_mb=%s is below DDP's first bucket (%s MiB), which the "
                "compiled model's bucket-wise graph splitting cannot handle: compiling the "
                "whole graph, so allreduces start after the backward instead of during it. "
                "For overlap, use sync.bucket_cap_mb>=%s or trainer.compile=false.",
                bucket_cap_mb, DDP_FIRST_BUCKET_BYTES / 2**20, DDP_FIRST_BUCKET_BYTES / 2**20)
    torch._dynamo.config.optimize_ddp = False


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Every rank starts from rank 0's parameters and buffers (DDP does this itself)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def _dense_strides(t: torch.Tensor) -> tuple[int, ...] | None:
    """t's strides if its elements fill numel() consecutive slots (contiguous,
    channels_last, any permutation), else None."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: t.stride(d)):
        if t.size(d) != 1:
            if t.stride(d) != expected:
                return None
            expected *= t.size(d)
    return t.stride()


def _flat_view(t: torch.Tensor) -> torch.Tensor | None:
    """A 1-D view of all of t's elements in memory order, or None if they are not dense."""
    if t.is_contiguous():
        return t.view(-1)
    if _dense_strides(t) is None:
        return None
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


class _Bucket:
    """A flat gradient buffer and, for each of its params, the view that is its .grad."""

    def __init__(self, params: list[nn.Parameter]):
        p0 = params[0]
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=p0.dtype, device=p0.device)
        self.views = []
        offset = 0
        for p in params:
            strides = _dense_strides(p)  # the param's own layout (e.g. channels_last)
            if strides is None:
                view = self.buffer[offset:offset + p.numel()].view(p.shape)
            else:
                view = self.buffer.as_strided(p.shape, strides, offset)
            self.views.append(view)
            offset += p.numel()

    def attach(self) -> None:
        """Make every param's .grad its view again, keeping any gradient already there.

        After zero_grad(set_to_none=True), backward allocates fresh .grad
        tensors: they are copied in once and replaced by the views.
        """
        for p, view in zip(self.params, self.views):
            g = p.grad
            if g is None:
                view.zero_()  # unused this step: counts as a zero gradient on this rank
            elif g.data_ptr() == view.data_ptr() and g.stride() == view.stride():
                continue
            else:
                view.copy_(g)
            p.grad = view


def _bucketed(params: list[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:
    """Consecutive params of one dtype and device, up to cap_bytes each (0: no cap)."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = buckets[-1] if buckets else None
        if (last is None or (last[0].dtype, last[0].device) != (p.dtype, p.device)
                or (cap_bytes > 0 and size + nbytes > cap_bytes)):
            buckets.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return buckets


class FlatSync(_Averaging):
    """After backward, one allreduce per flat buffer holding every gradient.

    Each param's .grad is a view into a persistent buffer, so backward writes
    (and accumulates, with grad_accum) straight into it: no copy on the way
    in or out. grads_set_to_none is False so the trainer zeroes the views in
    place; a set_to_none=True anyway only costs one copy at the next sync.
    """

    comm_timing = "after_backward"
    grads_set_to_none = False

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg)
        _broadcast_from_rank0(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = [_Bucket(ps) for ps in _bucketed(params, cfg.bucket_cap_mb * 2**20)]
        for b in self.buckets:
            b.attach()  # start with zero views, so the first backward accumulates into them

    def after_backward(self) -> None:
        with self._timed():
            for b in self.buckets:
                b.attach()
                self._average(b.buffer)


class PerParamSync(_Averaging):
    """After backward, one allreduce per parameter gradient."""

    comm_timing = "after_backward"

    def __init__(self, model: nn.Module, env: DistEnv, cfg):
        super().__init__(model, env, cfg)
        _broadcast_from_rank0(model)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def after_backward(self) -> None:
        with self._timed():
            for p in self.params:
                if p.grad is None:  # unused this step: a zero gradient on this rank
                    p.grad = torch.zeros_like(p)
                flat = _flat_view(p.grad)
                if flat is not None:
                    self._average(flat)
                else:
                    tmp = p.grad.contiguous().view(-1)
                    self._average(tmp)
                    p.grad.copy_(tmp.view(p.grad.shape))


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


def validate(cfg) -> None:
    """Reject unknown choices before any process group traffic (identically on every rank)."""
    for key, value, choices in (("sync.mode", cfg.mode, ("auto", *MODES)), ("sync.algo", cfg.algo, ALGOS),
                                ("sync.compress", cfg.compress, COMPRESS)):
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(choices)}")
    if cfg.mode in ("ddp", "auto") and cfg.bucket_cap_mb <= 0:
        raise ConfigError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb} must be > 0 with "
                          f"sync.mode={cfg.mode}")
    if cfg.bucket_cap_mb < 0:
        raise ConfigError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb} must be >= 0 "
                          "(0 with sync.mode=flat: one buffer for all gradients)")


def build_sync(cfg, model: nn.Module, env: DistEnv) -> GradSync:
    validate(cfg)
    if not env.distributed:
        return GradSync(model, env)
    mode = resolve_mode(cfg.mode, env.device)
    if mode != cfg.mode:  # the strategies read cfg.mode (describe() reports it)
        items = vars(cfg) if isinstance(cfg, SimpleNamespace) else dict(cfg)
        cfg = SimpleNamespace(**{**items, "mode": mode})
    cls = {"ddp": DDPSync, "flat": FlatSync, "per_param": PerParamSync}[mode]
    return cls(model, env, cfg)
