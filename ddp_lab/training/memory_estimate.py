"""Will a rank's training fit in memory? An estimate before the first step, against what
the machine has, so a run too large is refused in one line rather than swapping or
being killed by the kernel mid-step.

Per rank, in the parameters' dtype (float32):

    model state   parameters x (weight + gradient + the optimizer's state): Adam and AdamW
                  keep two moments (8 bytes a parameter), SGD with momentum one (4), plain
                  SGD none; any other optimizer is counted as Adam (most of torch's keep less)
    activations   what autograd keeps for the backward of one batch: one sample's forward
                  and loss run on the meta device (shapes only: no memory, no arithmetic),
                  the tensors it saves added up, times the samples per rank. Attention's
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

The predicted peak of a rank is the sum (peak_bytes, summary.json's predicted_peak_mb, beside
the measured peak_mem_mb). Under trainer.amp=bf16 the activations are counted as autocast makes them
(the forward on fake CPU tensors: the meta device has no autocast). The available memory is /proc/meminfo's
MemAvailable, or what this process's memory cgroup's limit leaves if less, shared by the
ranks on this machine. CPU runs only: a GPU's memory is
its own, and its kernels keep other things. Under sync=zero each rank keeps the
optimizer state of its 1/N of the parameters only (stage 1), their gradients (stage 2) and
their weights (stage 3; a block's whole weights while it computes are not counted).
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.config import ConfigError, targets
from ddp_lab.distributed import DistEnv, ranks_on_machine
from ddp_lab.models import build_model, model_name
from ddp_lab.models.calling import LABELS, call
from ddp_lab.sync import SyncOptions, every_step_options
from ddp_lab.sync.islands.layout import island_size
from ddp_lab.sync.periodic import DiLoCoOptions, PeriodicOptions
from ddp_lab.sync.sharded.fsdp import FSDPOptions

log = logging.getLogger("ddp_lab")

GiB = 2**30
WARN_SHARE = 0.8  # warn (not refuse) above this share of the available memory
# Measured peaks have come out at 0.90-1.11x the predicted one (every mode at 2-8 ranks: the peak-prediction
# record; stage 3 1.07 and fsdp 1.04 on capped hosts: memory-wall-8-hosts, hf-llama-8-hosts): a run fits only
# where its predicted peak and this share more stay within the memory a rank may use, so that "fits" is
# never said to a run the limit kills (tests/training/test_fit_check_records.py).
ESTIMATE_ERROR = 0.15


def fits(peak: int, memory: int) -> bool:
    """The one rule: a predicted peak fits `memory` (what a rank may hold, its runtime included) with the
    estimate's error to spare."""
    return peak * (1 + ESTIMATE_ERROR) <= memory
CGROUPS = Path("/sys/fs/cgroup")


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

    @property
    def state_bytes(self) -> int:
        return -(-self.weight_bytes // self.weight_shards) + -(-self.weight_bytes // self.grad_shards) + \
            self.optimizer_bytes + self.sync_bytes

    @property
    def total_bytes(self) -> int:
        """What the run adds to the process: the state, the activations, the transient buffers."""
        return self.state_bytes + self.activation_bytes + self.transient_bytes

    @property
    def peak_bytes(self) -> int:
        """The predicted peak of a rank: the runtime and what the run adds."""
        return self.runtime_bytes + self.total_bytes


# units of the largest unit held for moments beyond the state under stage 3 (by sync.algo) and fsdp:
# gathered weights, their gradients, reduce-scatters in flight (ours: up to 3, gloo's builtin doubling its)
TRANSIENT_UNITS = {"builtin": 7, "direct": 5, "ring_textbook": 5, "fsdp": 3}
BUCKETS_IN_FLIGHT = 3  # stages 1 and 2: IN_FLIGHT reduce-scatters and the bucket being filled


def checkpointed_units(net: torch.nn.Module, sync, checkpointing: str) -> list[torch.nn.Module]:
    """The modules trainer.activation_checkpointing checkpoints (training/activation_checkpointing.py)."""
    from ddp_lab.training.activation_checkpointing import chosen
    units = every_step_options(sync) if sync is not None else SyncOptions()  # (one process: the keys' defaults)
    return chosen(net, checkpointing, units.shard_units, units.unit_mb)


def transient_bytes(net: torch.nn.Module, weights: int, stage: int, sync) -> int:
    """The transient of the module docstring for this model under this sync (its options, or None)."""
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
    return TRANSIENT_UNITS.get(kind, 7) * largest + root


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
                     weights: torch.dtype | None = None) -> int:
    """Bytes autograd saves for the backward of one sample like (x, y): the forward and
    loss of two on the meta device, halved; each saved tensor counted once, the parameters not at all.
    `checkpointed` (trainer.activation_checkpointing's modules): of those, their inputs only, and the
    largest one's own saved tensors once (what its recompute holds in the backward). `autocast` (bf16
    under trainer.amp=bf16): the forward under CPU autocast, on fake CPU tensors (net is changed to them), the
    weights in `weights` where the sync gathers them so."""
    # (a dict batch's model, transformers', reads its masks' values: on fake tensors it skips those checks)
    on_fake = autocast is not None or isinstance(x, dict)
    with FakeTensorMode() if on_fake else contextlib.nullcontext():
        if on_fake:
            _to_fake_cpu(net, weights)
        return _saved_bytes(net, x, y, task, checkpointed, autocast)


def _saved_bytes(net, x, y, task, checkpointed, autocast) -> int:
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
    # two samples, not one: BatchNorm refuses to train on a batch of one value per channel
    device = "meta" if autocast is None and not isinstance(x, dict) else "cpu"
    xm = ({k: torch.zeros(2, *v.shape, dtype=v.dtype, device=device) for k, v in x.items()} if isinstance(x, dict)
          else torch.empty(2, *x.shape, dtype=x.dtype, device=device))
    ym = xm[LABELS] if isinstance(x, dict) else torch.empty(2, *y.shape, dtype=y.dtype, device=device)
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FusedAttention(), \
                torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            task.loss(call(net.train(), xm), ym)
    finally:
        for h in hooks:
            h.remove()
    recompute = max((sum(v.values()) for v in inside.values()), default=0)
    return (sum(saved.values()) + recompute) // 2


def estimate(model, optim, x: torch.Tensor, y: torch.Tensor, task, batch: int, shards: int = 1,
             stage: int = 1, sync=None, runtime: int = 0, checkpointing: str = "none",
             autocast: torch.dtype | None = None, gathered: torch.dtype | None = None) -> Estimate:
    """The estimate for `batch` samples per rank like (x, y), of the model and optimizer groups,
    with the optimizer state in `shards` parts (sync=zero: the world size), and from stage 2
    the gradients too; `sync` (its config group) for the transient, `runtime`: the process's bytes."""
    with torch.device("meta"):
        net = build_model(model)
    n = sum(p.numel() for p in net.parameters())
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    kept, name = optimizer_state(optim)
    fails = (RuntimeError, ValueError, TypeError, NotImplementedError, AssertionError, IndexError)
    per_sample = None
    if autocast is not None:  # (a twin: activation_bytes makes its model fake CPU tensors)
        try:
            with torch.device("meta"):
                twin = build_model(model)
            per_sample = activation_bytes(twin, x, y, task, checkpointed_units(twin, sync, checkpointing), autocast,
                                          gathered)
        except fails as e:  # a model that keeps meta tensors of its own: counted as in fp32 below
            log.info("memory estimate: activations counted in fp32 (%s)",
                     str(e).strip().splitlines()[0] if str(e) else e)
    if per_sample is None:
        try:
            per_sample = activation_bytes(net, x, y, task, checkpointed_units(net, sync, checkpointing))
        except fails as e:  # on meta
            log.info("memory estimate: activations not counted (%s)", str(e).strip().splitlines()[0] if str(e) else e)
            per_sample = 0
    optimizer = kept * -(-weights // shards)  # zero: this rank's shard's (the last one padded)
    return Estimate(n, weights, optimizer, per_sample * batch, batch, name, shards if stage >= 2 else 1,
                    shards if stage == 3 else 1, transient_bytes(net, weights, stage, sync), runtime,
                    sync_state_bytes(sync, weights, shards if stage == 3 else 1))


def mem_available(world_size: int) -> tuple[int, int, str] | None:
    """(bytes, the ranks that share them, what says so): /proc/meminfo's MemAvailable shared by the ranks
    on this machine, or what this process's memory cgroup (a container's, a SLURM job's, an emulated
    host's) leaves, shared by torchrun's local ranks, whichever leaves a rank less; None where neither."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [(int(ln.split()[1]) * 1024, ranks_on_machine(world_size), "MemAvailable")
                      for ln in f if ln.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    headroom = cgroup_headroom()
    if headroom is not None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        found.append((headroom, local, "the memory cgroup's limit leaves"))
    return min(found, key=lambda f: f[0] // f[1]) if found else None


def cgroup_headroom() -> int | None:
    """This process's memory cgroup's limit (v1 memory.limit_in_bytes, v2 memory.max) less what its
    processes hold but the page cache the kernel can drop; None where there is no limit to read."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            v1 = "memory" in controllers.split(",")
            if v1 or controllers == "":
                d = CGROUPS / ("memory" if v1 else "") / path.lstrip("/")
                names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else \
                    ("memory.max", "memory.current", "inactive_file")
                if (d / names[0]).exists():
                    break
        else:
            return None
        limit = int((d / names[0]).read_text().replace("max", str(2**63)))
        stat = dict(ln.split() for ln in (d / "memory.stat").read_text().splitlines())
        held = int((d / names[1]).read_text()) - int(stat.get(names[2], 0))
    except (OSError, ValueError):
        return None
    return max(limit - held, 0) if limit < 2**62 else None


def describe(e: Estimate, model, stage: int, available: int, ranks: int, machine: tuple[int, str]) -> str:
    """The line that says the estimate, the memory and what to lower."""
    where = "on this machine" if machine[1] == "MemAvailable" else "in this memory cgroup"
    digits = 1 if f"{e.total_bytes / GiB:.1f}" != f"{available / GiB:.1f}" else 2  # (not "1.2 more than 1.2")
    relation = "more than" if e.total_bytes > available else "close to" if \
        fits(e.peak_bytes, e.runtime_bytes + available) else f"within the estimate's {ESTIMATE_ERROR:.0%} error of"
    what = (f"model={model_name(model)} needs about {e.total_bytes / GiB:.{digits}f} GiB per rank, "
            f"{relation} the {available / GiB:.{digits}f} GiB "
            f"available to "
            f"each of the {ranks} rank(s) {where} ({machine[1]} {machine[0] / GiB:.1f} GiB): "
            f"activations {e.activation_bytes / GiB:.1f} GiB ({e.batch} samples per rank, what autograd keeps for "
            f"the backward), model state {e.state_bytes / GiB:.1f} GiB ({e.parameters:,} parameters: weights, "
            f"gradients and {e.optimizer}'s state" + (", DiLoCo's anchor and momentum" if e.sync_bytes else "")
            + ")" + (f", transient {e.transient_bytes / GiB:.1f} GiB (gathered units, buffers in flight)"
                     if e.transient_bytes else ""))
    if e.activation_bytes >= e.state_bytes:
        lower = ("data.batch_size or the context, model.block_size (activations grow with both"
                 if "block_size" in model else "data.batch_size (activations grow with it")
        fix = f"lower {lower}; trainer.grad_accum keeps the samples per step)"
    elif stage == 0:
        fix = ("shard the model state over the ranks (sync=zero sync.zero_stage=3), use a smaller model or an "
               "optimizer with less state (optim=sgd)")
    elif stage in (1, 2):
        fix = ("shard the gradients and the weights too (sync.zero_stage=3), use a smaller model or an optimizer "
               "with less state")
    else:
        fix = "use a smaller model or an optimizer with less state (optim=sgd)"
        whole = 2 * e.weight_bytes + e.optimizer_bytes * e.weight_shards  # the state before it is cut N ways
        room = available - e.activation_bytes - e.transient_bytes
        if room > 0 and e.weight_shards * room < whole:  # more ranks would make each one's share fit
            fix += f", shard it over at least {-(-whole // room)} ranks (each with this much memory)"
    return f"{what}; {fix}, or run fewer ranks per machine"


def state_shards(sync, env: DistEnv) -> int:
    """The ranks the model state is cut over: the world, or an island's (sync.islands: zero inside, HSDP)."""
    spec = str(sync.islands) if isinstance(sync, (PeriodicOptions, FSDPOptions)) else "none"
    if spec == "none":
        return env.world_size
    try:
        return island_size(spec, env.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)))
    except ConfigError:  # (refused, on every rank alike, where the sync is built)
        return env.world_size


def check_fits_memory(model, optim, env: DistEnv, x: torch.Tensor, y: torch.Tensor, task, batch: int, *,
                      stage: int = 0, refuse: bool = True, available: int | None = None,
                      sync=None, checkpointing: str = "none", autocast: torch.dtype | None = None,
                      gathered: torch.dtype | None = None) -> Estimate | None:
    """Refuse (`refuse`: trainer.memory_check) or warn about a CPU run whose estimate is more than the
    memory available to each rank; warn where it takes most of it. None where not checked.
    model, optim: their config groups; stage: sync.zero_stage under sync=zero (0: nothing sharded)."""
    if env.device.type != "cpu":
        return None
    found = mem_available(env.world_size) if available is None else \
        (available, ranks_on_machine(env.world_size), "MemAvailable")
    if found is None:
        return None
    try:
        e = estimate(model, optim, x, y, task, batch, state_shards(sync, env) if stage else 1, stage, sync,
                     runtime_bytes(), checkpointing, autocast, gathered)
    except Exception as err:  # a user's model that cannot be built on meta (it reads values, loads weights)
        log.info("memory estimate: not made (the model cannot be built on the meta device: %s)", err)
        return None
    machine, ranks = (found[0], found[2]), found[1]
    per_rank = machine[0] // ranks
    log.info("memory estimate: %.2f GiB per rank (activations %.2f, model state %.2f, transient %.2f), %.1f GiB "
             "available to each; predicted peak %.2f GiB with the runtime's %.2f", e.total_bytes / GiB,
             e.activation_bytes / GiB, e.state_bytes / GiB, e.transient_bytes / GiB, per_rank / GiB,
             e.peak_bytes / GiB, e.runtime_bytes / GiB)
    if not fits(e.peak_bytes, e.runtime_bytes + per_rank) and refuse:  # (per_rank: beyond what it holds now)
        raise ConfigError(describe(e, model, stage, per_rank, ranks, machine) +
                          " (trainer.memory_check=false: try anyway)")
    if e.total_bytes > WARN_SHARE * per_rank and env.is_main:
        log.warning("%s", describe(e, model, stage, per_rank, ranks, machine))
    return e
