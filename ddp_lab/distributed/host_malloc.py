"""trainer.host_malloc: which regime glibc's malloc runs a CPU rank's memory in.

A tensor's memory on CPU comes from malloc. glibc serves a block of at least its mmap threshold
with a fresh mmap and gives it back to the system when it is freed, so the next block of that
size is page-faulted in again, page by page. The threshold starts at 128 KiB and rises, up to
32 MiB, to the size of a freed mmapped block: glibc's default, after which freed blocks stay in
the process for the next ones. The regimes (docs/memory.md cites what each costs and saves):

* `auto` (the default): `lean` where stage 3 or fsdp shards the model on a CPU rank, glibc's own
  elsewhere (and wherever MALLOC_MMAP_THRESHOLD_ is set in the environment: the user's choice).
* `lean`: the threshold fixed at 1 MiB: every larger block goes back to the system when freed.
  Stage 3 and fsdp gather and free each unit's weights and gradients every step; kept, they raise
  the peak (the 403M GPT under stage 3 was killed by a memory limit it fits under this regime).
  Its price is a page fault for each page of each such block, each step: most of stage 3's step
  beyond DDP's on CPU.
* `glibc`: glibc's default, never touched: the faster choice for stage 3 and fsdp where memory does
  not bind. The memory estimate then prices a sharded model's weights and gradients whole (the freed
  gathers kept). (A threshold fixed at glibc's largest, 32 MiB, was no faster than its dynamic one: a
  fixed threshold also fixes the trim threshold at 128 KiB, so the heap's free top went back instead.)
* `keep`: the threshold fixed at 64 MiB and the heap's free top never given back (M_TRIM_THRESHOLD at
  its largest): every block under 64 MiB, once freed, stays for the next, whatever the history of the
  process (glibc's dynamic thresholds follow it: ddp_lab's GPT at its defaults, flat's gradients, took
  4.4 times the plain loop's page faults a step under them). Priced as `glibc`; opt-in (measured on one CPU kind).

Fixing the threshold turns glibc's dynamic one off for the whole process from the moment it is
set; blocks already allocated stay where they are. Another C library has no mallopt: `auto` leaves
it alone there, `lean` is refused.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

import torch

from ddp_lab.config import ConfigError

log = logging.getLogger("ddp_lab")
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1  # mallopt's parameter numbers (glibc's malloc.h)
LEAN_THRESHOLD = 1 << 20
# each regime's mallopt settings; keep: blocks under 64 MiB from the heap, its free top kept (C's INT_MAX)
SETTINGS = {"lean": ((M_MMAP_THRESHOLD, LEAN_THRESHOLD),),
            "keep": ((M_MMAP_THRESHOLD, 64 << 20), (M_TRIM_THRESHOLD, 2**31 - 1))}
SAID = {"lean": "host blocks of 1 MiB and more go back to the system when freed",
        "keep": "host blocks under 64 MiB stay in the process when freed"}
_state = {"choice": "auto", "applied": None}  # this process's trainer.host_malloc, and the regime it set


@functools.cache
def _glibc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return lib if hasattr(lib, "gnu_get_libc_version") and hasattr(lib, "mallopt") else None


def choose(regime: str) -> None:
    """The run's trainer.host_malloc, set by the builder before the model takes its memory: `lean` and
    `keep` are set here; `auto` waits for a sharded sync to ask (`for_sharded`)."""
    _state["choice"] = regime
    if regime in SETTINGS:
        _set(regime, refuse=True)
        log.info("trainer.host_malloc=%s: %s", regime, SAID[regime])


def for_sharded(device: torch.device) -> bool:
    """Stage 3 and fsdp on a CPU rank, under `auto`: the `lean` regime (see the module docstring); whether
    it is in force. Left alone on a GPU, off glibc, under another choice, or where the user set
    MALLOC_MMAP_THRESHOLD_."""
    if _state["applied"] == "lean":
        return True
    if device.type != "cpu" or _state["choice"] != "auto" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    done = _set("lean", refuse=False)
    if done:
        log.info("trainer.host_malloc=auto: lean (a sharded model): %s", SAID["lean"])
    return done


def keeps_freed_gathers(regime: str, device: torch.device) -> bool:
    """Whether a sharded model's freed gathers stay in the process (what the memory estimate prices)."""
    return str(regime) in ("glibc", "keep") and device.type == "cpu"


def _set(regime: str, refuse: bool) -> bool:
    """`regime`'s mallopt settings applied; whether they took (refused in one line where they did not and
    `refuse`)."""
    lib = _glibc()
    done = lib is not None and all(lib.mallopt(param, value) == 1 for param, value in SETTINGS[regime])
    if not done and refuse:
        raise ConfigError(f"trainer.host_malloc={regime} needs glibc's mallopt, which this system's C library lacks "
                          "or refused: use trainer.host_malloc=auto or glibc")
    if done:
        _state["applied"] = regime
    return done
