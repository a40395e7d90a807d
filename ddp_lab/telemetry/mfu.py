"""Model FLOPs utilisation (MFU): the share of the hardware's matmul peak that a run's
training arithmetic reaches.

    flops = train_flops_per_image(model, (1, 28, 28), torch.float32)  # once, before training
    peak = peak_for_run(device, torch.float32, world_size, local_world_size, threads_per_rank)
    mfu(flops, images_per_sec, peak)                                   # 0.0 .. 1.0

The FLOPs are what torch's own counter (torch.utils.flop_counter) finds in one
forward and backward pass of the model run eagerly: matmuls and convolutions,
2 FLOPs per multiply-add; normalisation, activations, pooling, bias additions and
the optimizer count nothing. The peak is not a data-sheet figure but measured: the
FLOP rate of a large square matmul on the same cores (or GPU) in the same dtype,
measured once per machine, thread count and dtype and cached on disk.

A model fed dict batches (a transformers model) is counted so too, on fake tensors: its forward
reads its masks' values, which it skips where they are fake (train_flops_per_sample).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ddp_lab.telemetry.provenance import cpu_facts

DEFAULT_CACHE = Path("~/.cache/ddp_lab/peak_flops.json")
# The matmul size, unless given: grown by doubling from MIN_SIZE until one call takes
# LONG_CALL_S, at most MAX_SIZE (full kernel speed: float32 on one Zen 1 core takes
# 0.5 s at 2048). A dtype the cores emulate (bf16 without avx512_bf16 or AMX) stops at
# a smaller size and takes seconds to measure rather than many minutes.
MIN_SIZE = 256
MAX_SIZE = {"cpu": 2048, "cuda": 8192}
LONG_CALL_S = 0.1
WARMUP_S = 2.0  # untimed matmuls before the timed ones (at least one)
TIMED_S = 5.0   # the timed calls stop after this long, at 3 calls or more


# ---------------------------------------------------------------- model FLOPs
def train_flops_per_image(model: nn.Module, input_shape, dtype: torch.dtype = torch.float32,
                          batch: int = 2, input_dtype: torch.dtype | None = None) -> int:
    """FLOPs of one training sample's forward and backward pass, as torch counts them.

    model: the bare model (a DDP wrapper or a torch.compile'd module is unwrapped).
    input_shape: one sample's shape, e.g. (1, 28, 28); input_dtype: the input's, where it
    is not the compute dtype (token ids: torch.long). Nothing is computed: the pass
    runs on the meta device with stand-ins for the parameters, so the model, its
    gradients and its BatchNorm statistics are left as they were.

    Backward counts only the gradients autograd computes: for a layer, its weight's
    and, unless the layer's input needs no gradient (the first layer's input is
    the data), its input's; each as many FLOPs as the layer's forward. The model is
    counted in eval mode, which changes no counted FLOPs (normalisation counts
    none) and keeps a SyncBatchNorm from talking to other ranks. lenet_fast counts
    its cropped sizes, the arithmetic its output needs; the zero channels it pads
    to when compiled are not model FLOPs and are not counted.
    """
    model = getattr(model, "module", model)  # DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # torch.compile
    params = dict(model.named_parameters())
    stand_ins = {name: _meta(t, dtype) for name, t in [*params.items(), *model.named_buffers()]}
    leaves = [stand_ins[name] for name, p in params.items() if p.requires_grad]
    for t in leaves:
        t.requires_grad_(True)
    x = torch.zeros((batch, *input_shape), dtype=input_dtype or dtype, device="meta")
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            out = torch.func.functional_call(model, stand_ins, (x,))
            torch.autograd.grad(out.float().sum(), leaves)
    finally:
        for m, training in modes.items():
            m.training = training
    return counter.get_total_flops() // batch


def train_flops_per_sample(model: nn.Module, sample: dict, dtype: torch.dtype = torch.float32, batch: int = 2) -> int:
    """train_flops_per_image for a model fed dict batches (`sample`: one sample's dict, labels among its keys): its
    forward by keyword and its own loss's backward, on meta stand-ins under FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ddp_lab.models.calling import loss_and_logits
    model = getattr(model, "module", model)
    model = getattr(model, "_orig_mod", model)
    params = dict(model.named_parameters())
    stand_ins = {name: _meta(t, dtype) for name, t in [*params.items(), *model.named_buffers()]}
    leaves = [stand_ins[name] for name, p in params.items() if p.requires_grad]
    for t in leaves:
        t.requires_grad_(True)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = {k: torch.zeros((batch, *v.shape), dtype=v.dtype, device="meta") for k, v in sample.items()}
            with FlopCounterMode(display=False) as counter:
                loss, logits = loss_and_logits(torch.func.functional_call(model, stand_ins, (), x))
                torch.autograd.grad(loss if loss is not None else logits.float().sum(), leaves)
    finally:
        for m, training in modes.items():
            m.training = training
    return counter.get_total_flops() // batch


def _meta(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(t, device="meta", dtype=dtype if t.is_floating_point() else t.dtype)


# ---------------------------------------------------------------- peak FLOPs
def peak_flops(device, dtype: torch.dtype = torch.float32, threads: int | None = None,
               size: int | None = None, repeats: int = 10,
               cache_path: str | Path | None = None) -> float:
    """Matmul FLOP/s of `threads` CPU threads (or of one GPU) in `dtype`, measured once.

    The figure is the best of up to `repeats` timed (size x size) @ (size x size)
    matmuls after WARMUP_S of warm-up calls (size: see MAX_SIZE; tests pass a tiny
    one), cached in `cache_path` (None: $DDP_LAB_PEAK_CACHE, else DEFAULT_CACHE, both
    looked up at the call, so tests point it elsewhere) under the machine (CPU model and core count, or
    GPU name), the thread count and the dtype, with how it was measured. A figure
    cached for another `size` is measured again. Callers that start together (one
    per rank) take turns on a lock file: the first measures alone, the others then
    read its figure.
    """
    device = torch.device(device)
    threads = (threads or torch.get_num_threads()) if device.type == "cpu" else 0
    key = _cache_key(device, dtype, threads)
    path = Path(cache_path or os.environ.get("DDP_LAB_PEAK_CACHE") or DEFAULT_CACHE).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = _read_cache(path)
        entry = cache.get(key)
        if entry is None or entry.get("requested_size") != size:
            entry = measure_matmul(device, dtype, threads, size, repeats)
            cache[key] = entry
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(cache, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)  # a reader never sees half a file
    return entry["flops_per_sec"]


def measure_matmul(device: torch.device, dtype: torch.dtype, threads: int,
                   size: int | None = None, repeats: int = 10) -> dict:
    """Time square matmuls; the cache entry: the best rate and how it was measured."""
    saved_threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    try:
        chosen = size or _grown_size(device, dtype)
        a, b, out = _operands(chosen, device, dtype)
        # Warm-up: thread pool, kernel choice, caches. On the 2-core Zen 1 the first
        # 2-thread calls after a 1-thread measurement ran up to 1.5x slower for ~1.3 s.
        warm_until = time.perf_counter() + WARMUP_S
        _timed_matmul(a, b, out)
        while time.perf_counter() < warm_until:
            _timed_matmul(a, b, out)
        seconds: list[float] = []
        stop = time.perf_counter() + TIMED_S
        while len(seconds) < repeats and (len(seconds) < 3 or time.perf_counter() < stop):
            seconds.append(_timed_matmul(a, b, out))
    finally:
        torch.set_num_threads(saved_threads)
    flops = 2 * chosen ** 3
    how_big = "given" if size else (f"doubled from {MIN_SIZE} until a call took "
                                    f"{LONG_CALL_S:g} s, at most {MAX_SIZE.get(device.type, 4096)}")
    entry = {
        "flops_per_sec": flops / min(seconds),
        "median_flops_per_sec": flops / statistics.median(seconds),
        "device": _device_name(device), "dtype": str(dtype).removeprefix("torch."),
        "threads": threads, "size": chosen, "requested_size": size, "repeats": len(seconds),
        "seconds": seconds,
        "method": f"best of {len(seconds)} torch.matmul of two {chosen}x{chosen} matrices after "
                  f"{WARMUP_S:g} s of warm-up calls, {flops:,} FLOPs each; size {how_big}",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.type == "cpu":
        entry["cores"] = os.cpu_count()
    else:  # "high" or "medium" let float32 matmuls run in TF32 or bf16
        entry["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return entry


def _grown_size(device: torch.device, dtype: torch.dtype) -> int:
    size, largest = MIN_SIZE, MAX_SIZE.get(device.type, 4096)
    while size < largest:
        operands = _operands(size, device, dtype)
        if min(_timed_matmul(*operands) for _ in range(2)) >= LONG_CALL_S:
            break
        size *= 2
    return size


def _operands(size: int, device: torch.device, dtype: torch.dtype) -> tuple:
    # (a generator of its own: drawing from the run's would make dropout's masks depend on the peak's cache)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=g).to(dtype)
    b = torch.randn(size, size, device=device, generator=g).to(dtype)
    return a, b, torch.empty(size, size, device=device, dtype=dtype)


def _timed_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> float:
    if a.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    t0 = time.perf_counter()
    torch.matmul(a, b, out=out)
    return time.perf_counter() - t0


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_facts()["cpu_model"] or "cpu"


def _cache_key(device: torch.device, dtype: torch.dtype, threads: int) -> str:
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type == "cpu":
        return f"cpu|{_device_name(device)}|cores={os.cpu_count()}|threads={threads}|{dtype_name}"
    return f"{device.type}|{_device_name(device)}|{dtype_name}"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measure again and write a fresh one


def peak_for_run(device, dtype: torch.dtype, world_size: int, local_world_size: int,
                 threads_per_rank: int, **kwargs) -> float:
    """The peak of everything a run computes on, for mfu() against its global images/s.

    CPU ranks: the matmul peak of the threads all ranks of a machine run (at most its
    usable cores), measured in one process, times the machines. GPU ranks: one GPU's
    peak times the ranks. kwargs go to peak_flops (size, cache_path, ...).
    """
    device = torch.device(device)
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = min(local_world_size * threads_per_rank, cores or 1)
        return peak_flops(device, dtype, threads, **kwargs) * (world_size // local_world_size)
    return peak_flops(device, dtype, **kwargs) * world_size


# ---------------------------------------------------------------- MFU
def mfu(flops_per_image: float, images_per_sec: float, peak: float) -> float:
    """Model FLOPs per second over the peak: 1.0 would be the matmul peak's rate."""
    if not (peak > 0 and math.isfinite(peak)):
        raise ValueError(f"peak={peak!r}: the peak FLOP rate must be a positive finite number")
    return flops_per_image * images_per_sec / peak
