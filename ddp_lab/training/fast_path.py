"""The fast path's settings that depend on the machine: bf16 autocast and torch.compile.

`trainer.amp=auto` and `trainer.compile=auto` are resolved here, once per run,
into what the Trainer does (for compile, with the reason it logs); the knobs
are described with every trainer.* key in ddp_lab/config/schema.py (and docs/configuration.md).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from ddp_lab.config import ConfigError


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls run natively rather than emulated (and slow)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast(amp: str, device: torch.device):
    """The context the forward pass runs in: autocast to bf16 or fp16, or nothing."""
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def resolve_amp(amp: str, device: torch.device) -> str:
    """trainer.amp=auto picks bf16 where the hardware runs it fast, else off."""
    if amp == "auto":
        fast = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_fast_bf16()
        return "bf16" if fast else "off"
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("trainer.amp=fp16 needs CUDA; on CPU use trainer.amp=bf16 or off")
    return amp


def amp_reason(setting: str, resolved: str, device: torch.device) -> str:
    """The one log line saying what trainer.amp came to, and why."""
    if setting != "auto":
        return f"trainer.amp={setting}"
    where = "this GPU" if device.type == "cuda" else "this CPU"
    has = "runs bf16 natively" if resolved == "bf16" else "has no native bf16"
    detail = "" if device.type == "cuda" else " (avx512_bf16 or AMX)"
    return f"trainer.amp=auto: {resolved}, {where} {has}{detail}"


# torch.compile's first step builds kernels: ~16 s for LeNet on the 2-core
# development machine with an empty inductor cache, a few seconds from the
# cache. After that every image costs ~15% less on CPU, so what compiling
# saves grows with the images each rank trains on, whatever the batch:
# 250,000 images per rank (a 10-epoch run on 2 ranks trains 300,000) save
# ~8-10 s, about a cold compile's cost and many times a cached one's. A full
# run compiles; a quick check does not.
AUTO_COMPILE_MIN_IMAGES = 250_000


def inductor_available(device: torch.device) -> bool:
    """Whether torch.compile's default backend can build kernels here: Triton on CUDA,
    a C++ compiler on CPU."""
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    return any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++"))


def resolve_compile(setting, device: torch.device, images_per_rank: int, eager: str = "") -> tuple[bool, str]:
    """trainer.compile=auto|true|false -> (compile?, why), the reason for the run log.

    images_per_rank: the images one rank trains on in this run (steps x its batch); eager: why the model
    must run eagerly ("" where it need not; the builder refuses trainer.compile=true then).
    """
    value = str(setting).lower()  # one of auto, true, false (ddp_lab.config.schema checks)
    if value != "auto":
        return value == "true", f"trainer.compile={value}"
    if eager:
        return False, f"trainer.compile=auto: off, {eager}"
    if images_per_rank < AUTO_COMPILE_MIN_IMAGES:
        return False, (f"trainer.compile=auto: off, {images_per_rank:,} samples per rank are too "
                       f"few to repay compiling (needs {AUTO_COMPILE_MIN_IMAGES:,})")
    if not inductor_available(device):
        need = "Triton" if device.type == "cuda" else "a C++ compiler (g++ or clang++)"
        return False, f"trainer.compile=auto: off, torch.compile needs {need}, not found"
    return True, f"trainer.compile=auto: on ({images_per_rank:,} samples per rank)"


def own_compile_cache(rank: int) -> str | None:
    """Give this rank an inductor cache of its own (TORCHINDUCTOR_CACHE_DIR=<default>/rank<N>)
    unless the user chose one; returns it. The ranks of a machine otherwise share one cache
    guarded by file locks, and a rank stopped while holding a lock (SIGSTOP, a debugger)
    held every other rank with it, outside any collective and any timeout. The cost: each
    rank fills its own cache once (docs/failures.md gives the measured compile times)."""
    default = inductor_default_cache_dir()
    # importing torch._inductor sets the variable to the default itself: only another
    # value is the user's choice
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) != default:
        return None
    path = os.path.join(default, f"rank{rank}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def inductor_default_cache_dir() -> str:
    """torch's default inductor cache (torch/_inductor/runtime/cache_dir_utils.py: the temp folder's
    torchinductor_<user>), found without importing torch._inductor, which takes 2 s of every rank's
    start-up, compiling or not (tests/training/test_fast_path.py checks it against torch's)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
