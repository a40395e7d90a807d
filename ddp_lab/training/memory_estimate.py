"""What a rank's training will hold in memory, estimated before the first step without making
the model (training/fit_check.py checks it against what the machine has).

Per rank, in the parameters' dtype (float32):

    model state   parameters x (weight + gradient + the optimizer's state): Adam and AdamW
                  keep two moments (8 bytes a parameter), SGD with momentum one (4), plain
                  SGD none; any other optimizer is counted as Adam (most of torch's keep less)
    activations   what autograd keeps for the backward of one batch: the forward and loss of
                  2 and of 4 samples run on the meta device (shapes only: no memory, no
                  arithmetic), the tensors they save added up: what 2 more add is a sample's,
                  times the samples per rank, the rest once (autocast's casts of the weights,
                  the loss's scalars). Attention's
                  T x T score matrices count only where the kernel keeps them: torch's math
                  kernel does, the fused CPU kernel (what a CPU run of model=gpt gets)
                  keeps one number per row. Measured against a CPU step of model=gpt
                  (contexts 1024 and 4096): 80% of the peak it took, the rest the
                  backward's transient buffers, so the estimate errs on the side of running

    runtime       the process before the model: torch's libraries, the data, the process group
                  (this process's RSS at the check: 0.4-0.7 GB on CPU)
    transient     held for moments beyond the state: under stage 3 and fsdp the units gathered,
                  their gradients and the reduce-scatters in flight, in units of the largest
                  unit (TRANSIENT_UNITS, measured on a 101M-parameter GPT at 2 ranks: the
                  memory-wall-8-hosts record) and the root unit, whole from the forward to the
                  backward's end; below stage 3 one more gradient-sized buffer (DDP's buckets,
                  flat's flattened gradients; zero's buckets in flight, 3 of bucket_cap_mb)
    compile       torch.compile's compiler and the code it makes (COMPILE_BYTES), where the run compiles
    loading       the process's own peak before the check (reading and decoding the data, whose
                  transient buffers are gone by then), where that was higher than their sum
    workers       the DataLoader's worker processes (data.loader=dataloader), WORKER_BYTES each and the
                  Python objects of their dataset, which each may copy (datasets/object_bytes.py):
                  not in the rank's own peak, but in its host's memory, which the check weighs

The predicted peak of a rank is the sum, or the loading's peak where that was higher (peak_bytes,
summary.json's predicted_peak_mb, beside the measured peak_mem_mb, which is the whole run's).
Under trainer.amp=bf16 the activations are counted as autocast makes them
(the forward on fake CPU tensors: the meta device has no autocast). What it is checked against, and the
rule that says it fits: training/fit_check.py. Under sync=zero each rank keeps the
optimizer state of its 1/N of the parameters only (stage 1), their gradients (stage 2) and
their weights (stage 3; a block's whole weights while it computes are not counted).
"""
from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.config import ConfigError, targets
from ddp_lab.models import build_model
from ddp_lab.models.calling import LABELS, call
from ddp_lab.sync import SyncOptions, every_step_options
from ddp_lab.sync.periodic import DiLoCoOptions
from ddp_lab.sync.sharded.fsdp import FSDPOptions

log = logging.getLogger("ddp_lab")

GiB = 2**30


@dataclass(frozen=True)
class Estimate:
    parameters: int
    weight_bytes: int       # the weights; the gradients take as much
    optimizer_bytes: int    # the optimizer's state
    activation_bytes: int   # saved for the backward, for `batch` samples
    batch: int              # samples per rank in one forward
    optimizer: str
    grad_shards: int = 1    # the gradients kept between steps are 1/grad_shards of the weights (ZeRO stage 2)
    weight_shards: int = 1  # and the weights themselves (stage 3: both)
    transient_bytes: int = 0  # gathered units, buffers in flight (see the module docstring)
    runtime_bytes: int = 0    # the process before the model (its RSS at the check)
    sync_bytes: int = 0       # what the strategy keeps beside them (sync_state_bytes: DiLoCo's copies)
    compile_bytes: int = 0    # torch.compile's (COMPILE_BYTES where the run compiles)
    loaded_peak_bytes: int = 0  # the process's peak before the check (loading the data)
    workers: int = 0          # the DataLoader's worker processes, of their own (not in peak_bytes)
    copied_bytes: int = 0     # what they may copy of their datasets' Python objects, together

    @property
    def state_bytes(self) -> int:
        return -(-self.weight_bytes // self.weight_shards) + -(-self.weight_bytes // self.grad_shards) + \
            self.optimizer_bytes + self.sync_bytes

    @property
    def total_bytes(self) -> int:
        """What the run adds to the process: the state, the activations, the transient buffers, the compiler."""
        return self.state_bytes + self.activation_bytes + self.transient_bytes + self.compile_bytes

    @property
    def ahead_bytes(self) -> int:
        """The peak still to come after the check: the runtime and what the run adds (what the check refuses by:
        the loading's peak has passed)."""
        return self.runtime_bytes + self.total_bytes

    @property
    def worker_bytes(self) -> int:
        """The DataLoader's workers: WORKER_BYTES each and the copies they may make."""
        return self.workers * WORKER_BYTES + self.copied_bytes

    @property
    def host_bytes(self) -> int:
        """What the rank takes of its host's memory from the check on: what is ahead and its DataLoader workers."""
        return self.ahead_bytes + self.worker_bytes

    @property
    def peak_bytes(self) -> int:
        """The predicted peak of a rank over its whole run: what is to come, or the loading's where that was higher."""
        return max(self.ahead_bytes, self.loaded_peak_bytes)


# units of the largest unit held for moments beyond the state under stage 3 (by sync.algo) and fsdp:
# gathered weights, their gradients, reduce-scatters in flight (ours: up to 3, gloo's builtin doubling its)
TRANSIENT_UNITS = {"builtin": 7, "direct": 5, "ring_textbook": 5, "fsdp": 3}
BUCKETS_IN_FLIGHT = 3  # stages 1 and 2: IN_FLIGHT reduce-scatters and the bucket being filled
# torch.compile on CPU: dynamo, inductor and the code they make, the graphs of training and evaluation; measured
# as a run's peak over the same run eager, the first time a model compiles on a machine: LeNet +61-96 MiB,
# gpt_small +91-97 (6 layers) and +105-114 (12), ResNet-18 +155-164, the largest (docs/memory.md, the
# default-run-peak record; with the cache warm +47-126)
COMPILE_BYTES = 160 * 2**20
# a DataLoader worker's own memory (USS) at its largest over a run: Fashion-MNIST's training workers 43-44 MiB, its
# evaluation workers 10-11, text's 8-9; beside it, the Python objects of its dataset it copies (priced apart)
WORKER_BYTES = 48 * 2**20


def checkpointed_units(net: torch.nn.Module, sync, checkpointing: str) -> list[torch.nn.Module]:
    """The modules trainer.activation_checkpointing checkpoints (training/activation_checkpointing.py)."""
    from ddp_lab.training.activation_checkpointing import chosen
    units = every_step_options(sync) if sync is not None else SyncOptions()  # (one process: the keys' defaults)
    return chosen(net, checkpointing, units.shard_units, units.unit_mb)


def transient_bytes(net: torch.nn.Module, weights: int, stage: int, sync, freed_kept: bool = False) -> int:
    """The transient of the module docstring for this model under this sync (its options, or None);
    `freed_kept`: trainer.host_malloc=glibc on CPU, where the freed gathers of a sharded model stay in the
    process: its weights and gradients priced whole (docs/memory.md, the host-malloc record)."""
    if sync is None:  # (one process: no sync's buffers)
        return 0
    opts = every_step_options(sync)  # (islands: the strategy inside, which holds the buffers)
    if stage < 3:
        if stage in (1, 2) and opts.bucket_cap_mb > 0:  # (zero's buckets)
            return min(weights, int(BUCKETS_IN_FLIGHT * opts.bucket_cap_mb * 2**20))
        return weights  # one gradient-sized buffer
    from ddp_lab.sync.sharded.units import unit_modules
    units = unit_modules(net, opts.shard_units, opts.unit_mb)
    in_units = {id(p) for m in units for p in m.parameters()}
    largest = max((sum(p.numel() * p.element_size() for p in m.parameters()) for m in units), default=0)
    root = sum(p.numel() * p.element_size() for p in net.parameters() if id(p) not in in_units)
    kind = "fsdp" if isinstance(opts, FSDPOptions) else opts.algo
    return TRANSIENT_UNITS.get(kind, 7) * largest + root + (2 * weights if freed_kept else 0)


def sync_state_bytes(sync, weights: int, shards: int) -> int:
    """DiLoCo's copies of the trained weights, of this rank's shard where stage 3 shards them inside islands
    (`shards`: the ranks they are cut over, else 1): the anchor; the outer momentum; with sync.overlap the outer
    gradient in flight, under eager its proxy anchor too (the paper's proxy: its last mean and sent); int8 and
    int4's error feedback, what rounding left out of the sent (a copy) and of the mean (a copy over the islands'
    count, counted whole here). Other strategies keep none beyond the model and its optimizer."""
    if not isinstance(sync, DiLoCoOptions):
        return 0
    eager = sync.overlap > 0 and sync.overlap_update == "eager"
    copies = (1 + (sync.outer_momentum > 0) + (sync.overlap > 0) + eager + 2 * (eager and sync.eager_proxy == "paper")
              + 2 * (sync.compress in QUANTIZED and sync.rounding == "feedback"))
    return copies * -(-weights // shards)


def runtime_bytes() -> int:
    """This process's resident memory now (Linux /proc/self/statm; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_runtime_bytes() -> int:
    """This process's peak resident memory so far (getrusage's ru_maxrss, KiB on Linux; 0 elsewhere)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if sys.platform == "linux" else 0


def optimizer_state(optim_cfg) -> tuple[int, str]:
    """(state tensors kept per parameter, the optimizer's name) for the optim group."""
    try:
        cls = targets.resolve("optim", optim_cfg)
    except ConfigError:  # said where the optimizer is built
        return 2, str(optim_cfg.get("_target_"))
    name = getattr(cls, "__name__", str(cls))
    if isinstance(cls, type) and issubclass(cls, torch.optim.SGD):
        return (1 if (optim_cfg.get("momentum") or 0) > 0 else 0), name
    return 2, name


class _FusedAttention(TorchFunctionMode):
    """On the meta device scaled_dot_product_attention takes torch's math kernel, which
    saves every T x T score matrix; where a CPU run would take the fused kernel (which
    saves one log-sum-exp per row), run that one on meta instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and _fused_on_cpu(*args, **kwargs):
            q, k, v = args[:3]
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, kwargs.get("dropout_p", 0.0), kwargs.get("is_causal", False), scale=kwargs.get("scale"))[0]
        return func(*args, **kwargs)


def _fused_on_cpu(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_) -> bool:
    """Whether torch picks its fused (flash) kernel for CPU tensors like these."""
    if attn_mask is not None or q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        return False
    try:  # a tiny stand-in of the same heads, head size and dtype: the choice does not depend on T
        t = torch.zeros(1, q.shape[1], 2, q.shape[3], dtype=q.dtype, requires_grad=True)
        choice = torch._fused_sdp_choice(t, t, t, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        return choice == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    except (AttributeError, RuntimeError, TypeError):
        return False


def _to_fake_cpu(net: torch.nn.Module, weights: torch.dtype | None = None) -> None:
    """net's meta parameters and buffers swapped, in place, for CPU tensors of the FakeTensorMode entered
    (shapes only, no memory): autocast, which the meta device lacks, then casts as on a CPU; the floating
    parameters in `weights` where given (stage 3 and fsdp's bf16 gathers)."""
    made: dict[int, torch.Tensor] = {}  # (a tied parameter stays one)
    for m in net.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                dtype = weights if weights is not None and p.is_floating_point() else p.dtype
                m._parameters[name] = made.setdefault(id(p), torch.nn.Parameter(
                    torch.empty(p.shape, dtype=dtype, device="cpu"), requires_grad=p.requires_grad))
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cpu")


def activation_bytes(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task,
                     checkpointed: list[torch.nn.Module] = (), autocast: torch.dtype | None = None,
                     weights: torch.dtype | None = None, batch: int = 1) -> int:
    """Bytes autograd saves for the backward of `batch` samples like (x, y): the forward and loss of 2 and of 4
    on the meta device, what 2 more samples add a sample, and once what both save alike (the loss's scalars;
    under autocast the weights' bf16 casts, as large for any batch: counted a sample, they made a bf16 DDP run's
    estimate 0.16 GiB high on gpt2 at 4 samples); each saved tensor counted once, the parameters not at all.
    `checkpointed` (trainer.activation_checkpointing's modules): of those, their inputs only, and the
    largest one's own saved tensors once (what its recompute holds in the backward). `autocast` (bf16
    under trainer.amp=bf16): the forward under CPU autocast, on fake CPU tensors (net is changed to them), the
    weights in `weights` where the sync gathers them so."""
    # (a dict batch's model, transformers', reads its masks' values: on fake tensors it skips those checks)
    on_fake = autocast is not None or isinstance(x, dict)
    with FakeTensorMode() if on_fake else contextlib.nullcontext():
        if on_fake:
            _to_fake_cpu(net, weights)
        two, four = (_saved_bytes(net, x, y, task, checkpointed, autocast, n) for n in (2, 4))
    per_sample = (four - two) / 2
    return round(max(0.0, two - 2 * per_sample) + batch * per_sample)


def _saved_bytes(net, x, y, task, checkpointed, autocast, samples: int) -> int:
    params = {id(p) for p in net.parameters()}
    saved: dict[int, int] = {}
    inside: dict[int, dict[int, int]] = {id(m): {} for m in checkpointed}
    running: list[int] = []  # the checkpointed module whose forward runs

    def size(t: torch.Tensor) -> tuple[int, int]:
        base = t._base if t._base is not None else t  # a view keeps its base's storage
        return id(base), base.numel() * base.element_size()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in params and (t._base is None or id(t._base) not in params):
            key, n = size(t)
            (inside[running[-1]] if running else saved)[key] = n
        return t

    def enter(m, args):
        if not running:
            for t in tree_leaves(args):
                if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in params:
                    saved.setdefault(*size(t))  # what the checkpoint keeps
        running.append(id(m))

    def leave(*_) -> None:
        running.pop()

    hooks = [h for m in checkpointed for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    # (2 samples or more: BatchNorm refuses to train on a batch of one value per channel)
    device = "meta" if autocast is None and not isinstance(x, dict) else "cpu"
    xm = ({k: torch.zeros(samples, *v.shape, dtype=v.dtype, device=device) for k, v in x.items()}
          if isinstance(x, dict) else torch.empty(samples, *x.shape, dtype=x.dtype, device=device))
    ym = xm[LABELS] if isinstance(x, dict) else torch.empty(samples, *y.shape, dtype=y.dtype, device=device)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FusedAttention(), \
                torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            task.loss(call(net.train(), xm), ym)
    finally:
        for h in hooks:
            h.remove()
    recompute = max((sum(v.values()) for v in inside.values()), default=0)
    return sum(saved.values()) + recompute


def estimate(model, optim, x: torch.Tensor, y: torch.Tensor, task, batch: int, shards: int = 1,
             stage: int = 1, sync=None, runtime: int = 0, checkpointing: str = "none",
             autocast: torch.dtype | None = None, gathered: torch.dtype | None = None,
             freed_kept: bool = False, compiled: bool = False, loaded_peak: int = 0, workers: int = 0,
             copied: int = 0) -> Estimate:
    """The estimate for `batch` samples per rank like (x, y), of the model and optimizer groups,
    with the optimizer state in `shards` parts (sync=zero: the world size), and from stage 2
    the gradients too; `sync` (its config group) for the transient, `runtime`: the process's bytes,
    `loaded_peak` its peak so far; `freed_kept`: see transient_bytes; `compiled`: the run compiles its model;
    `workers`: the DataLoader worker processes the rank runs (data.loader_workers), `copied`: the bytes of their
    datasets' Python objects, summed over them (data.loader_copies)."""
    with torch.device("meta"):
        net = build_model(model)
    n = sum(p.numel() for p in net.parameters())
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    kept, name = optimizer_state(optim)
    fails = (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError, IndexError)
    activations = None
    if autocast is not None:  # (a twin: activation_bytes makes its model fake CPU tensors)
        try:
            with torch.device("meta"):
                twin = build_model(model)
            activations = activation_bytes(twin, x, y, task, checkpointed_units(twin, sync, checkpointing),
                                           autocast, gathered, batch)
        except fails as e:  # a model that keeps meta tensors of its own: counted as in fp32 below
            log.info("memory estimate: activations counted in fp32 (%s)",
                     str(e).strip().splitlines()[0] if str(e) else e)
    if activations is None:
        try:
            activations = activation_bytes(net, x, y, task, checkpointed_units(net, sync, checkpointing), batch=batch)
        except fails as e:  # on meta
            log.info("memory estimate: activations not counted (%s)", str(e).strip().splitlines()[0] if str(e) else e)
            activations = 0
    optimizer = kept * -(-weights // shards)  # zero: this rank's shard's (the last one padded)
    return Estimate(n, weights, optimizer, activations, batch, name, shards if stage >= 2 else 1,
                    shards if stage == 3 else 1, transient_bytes(net, weights, stage, sync, freed_kept), runtime,
                    sync_state_bytes(sync, weights, shards if stage == 3 else 1), COMPILE_BYTES if compiled else 0,
                    loaded_peak, workers, copied)
