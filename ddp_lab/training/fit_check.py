"""The fit check: a rank's estimate (training/memory_estimate.py) against the memory it may use, before
the first step, so a run too large is refused in one line rather than swapping or being killed mid-step.

The available memory is /proc/meminfo's MemAvailable, or what this process's memory cgroup's limit
leaves if less (a container's, a SLURM job's, an emulated host's), shared by the ranks on this machine.
CPU runs only: a GPU's memory is its own, and its kernels keep other things. The rule (`fits`) keeps
the estimate's measured error to spare; `will_it_fit` applies the same one.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv, ranks_on_machine
from ddp_lab.models import model_name
from ddp_lab.sync.islands.layout import island_size
from ddp_lab.sync.periodic import PeriodicOptions
from ddp_lab.sync.sharded.fsdp import FSDPOptions
from ddp_lab.telemetry import position
from ddp_lab.training.memory_estimate import Estimate, GiB, estimate, peak_runtime_bytes, runtime_bytes

log = logging.getLogger("ddp_lab")

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
    need = e.total_bytes + e.worker_bytes
    digits = 1 if f"{need / GiB:.1f}" != f"{available / GiB:.1f}" else 2  # (not "1.2 more than 1.2")
    relation = "more than" if need > available else "close to" if \
        fits(e.host_bytes, e.runtime_bytes + available) else f"within the estimate's {ESTIMATE_ERROR:.0%} error of"
    what = (f"model={model_name(model)} needs about {need / GiB:.{digits}f} GiB per rank, "
            f"{relation} the {available / GiB:.{digits}f} GiB "
            f"available to "
            f"each of the {ranks} rank(s) {where} ({machine[1]} {machine[0] / GiB:.1f} GiB): "
            f"activations {e.activation_bytes / GiB:.1f} GiB ({e.batch} samples per rank, what autograd keeps for "
            f"the backward), model state {e.state_bytes / GiB:.1f} GiB ({e.parameters:,} parameters: weights, "
            f"gradients and {e.optimizer}'s state" + (", DiLoCo's anchor and momentum" if e.sync_bytes else "")
            + ")" + (f", transient {e.transient_bytes / GiB:.1f} GiB (gathered units, buffers in flight)"
                     if e.transient_bytes else "")
            + (f", torch.compile {e.compile_bytes / GiB:.1f} GiB" if e.compile_bytes else "")
            + (f", DataLoader workers {e.worker_bytes / GiB:.1f} GiB (data.num_workers"
               + (", and the copies they may make of the data's Python objects: tensors or arrays are not copied"
                  if e.copied_bytes >= 2**20 else "") + ")" if e.worker_bytes else ""))
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
                      gathered: torch.dtype | None = None, freed_kept: bool = False,
                      compiled: bool = False, workers: int = 0, copied: int = 0) -> Estimate | None:
    """Refuse (`refuse`: trainer.memory_check) or warn about a CPU run whose estimate is more than the
    memory available to each rank; warn where it takes most of it. None where not checked.
    model, optim: their config groups; stage: sync.zero_stage under sync=zero (0: nothing sharded).
    compiled: the run compiles its model (trainer.compile, resolved); workers: the DataLoader worker processes the
    rank runs, copied: the bytes of their datasets' Python objects they may copy, summed over them. Every rank
    refuses where one does: hosts differ, and the others would end on a closed connection."""
    if env.device.type != "cpu":
        return None
    e, refusal = _check_this_rank(model, optim, env, x, y, task, batch, stage, available, sync, checkpointing,
                                  autocast, gathered, freed_kept, compiled, workers, copied)
    if refuse and env.distributed and dist.is_initialized():
        refusing = _refusing_ranks(refusal is not None, env)
        if refusal is None and refusing:
            raise ConfigError(f"rank {refusing[0]}'s memory cannot hold this run (its line says what to lower); "
                              "this rank's can (trainer.memory_check=false: try anyway)")
    if refusal is not None and refuse:
        raise ConfigError(refusal + " (trainer.memory_check=false: try anyway)")
    if refusal is not None and env.is_main:
        log.warning("%s", refusal)
    return e


def _check_this_rank(model, optim, env, x, y, task, batch, stage, available, sync, checkpointing, autocast,
                     gathered, freed_kept=False, compiled=False, workers=0,
                     copied=0) -> tuple[Estimate | None, str | None]:
    """(this rank's estimate, or None where not made; the refusal's line where it does not fit, else None),
    the estimate logged and, where it takes most of the memory, warned about on rank 0."""
    found = mem_available(env.world_size) if available is None else \
        (available, ranks_on_machine(env.world_size), "MemAvailable")
    if found is None:
        return None, None
    try:
        e = estimate(model, optim, x, y, task, batch, state_shards(sync, env) if stage else 1, stage, sync,
                     runtime_bytes(), checkpointing, autocast, gathered, freed_kept, compiled, peak_runtime_bytes(),
                     workers, copied)
    except Exception as err:  # a user's model that cannot be built on meta (it reads values, loads weights)
        log.info("memory estimate: not made (the model cannot be built on the meta device: %s)", err)
        return None, None
    machine, ranks = (found[0], found[2]), found[1]
    per_rank = machine[0] // ranks
    log.info("memory estimate: %.2f GiB per rank (activations %.2f, model state %.2f, transient %.2f%s), %.1f GiB "
             "available to each; predicted peak %.2f GiB with the runtime's %.2f%s", e.total_bytes / GiB,
             e.activation_bytes / GiB, e.state_bytes / GiB, e.transient_bytes / GiB,
             f", torch.compile {e.compile_bytes / GiB:.2f}" if e.compile_bytes else "", per_rank / GiB,
             e.peak_bytes / GiB, e.runtime_bytes / GiB,
             f" (the data's loading peaked there; {e.ahead_bytes / GiB:.2f} ahead)"
             if e.peak_bytes > e.ahead_bytes else "")
    if e.worker_bytes:
        log.info("memory estimate: and the DataLoader's %d worker processes, %.2f GiB beside the rank%s; counted in "
                 "what fits (data.num_workers=0: none)", e.workers, e.worker_bytes / GiB,
                 f", {e.copied_bytes / GiB:.2f} of it for the copies they may make of the data's Python objects "
                 "(tensors and arrays are not copied)" if e.copied_bytes >= 2**20 else "")
    # (the loading's peak has passed: what is still to come must fit what this rank may hold)
    if not fits(e.host_bytes, e.runtime_bytes + per_rank):  # (per_rank: beyond what it holds now)
        return e, describe(e, model, stage, per_rank, ranks, machine)
    if e.total_bytes + e.worker_bytes > WARN_SHARE * per_rank and env.is_main:
        log.warning("%s", describe(e, model, stage, per_rank, ranks, machine))
    return e, None


def _refusing_ranks(mine: bool, env: DistEnv) -> list[int]:
    """The ranks whose own check refused the run (one all-reduce: each rank its flag)."""
    flags = torch.zeros(env.world_size, dtype=torch.int32)
    flags[env.rank] = int(mine)
    with position.collective("memory check"):
        dist.all_reduce(flags)
    return [r for r, f in enumerate(flags.tolist()) if f]
