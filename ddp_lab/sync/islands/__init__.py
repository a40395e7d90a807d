"""sync.islands: ranks in islands, every step averaged inside each (a fast link), a periodic strategy across
them (a slow one). The DiLoCo paper's setting and torchft's: many devices in a datacenter or host train as
one replica, and only the replicas exchange outer gradients.

    layout.py   which ranks form an island; the groups inside and across; the mean over islands, each rank
                sending its 1/K chunk across and the island gathering the chunks inside
    sync.py     IslandSync: the every-step strategy of sync.inner on the island's group, sync.mode's
                periodic one across (DiLoCo, local SGD)

sync.islands=host: torchrun's node (LOCAL_WORLD_SIZE ranks); K: consecutive runs of K ranks; none (the
default): every rank on its own, as before. sync.inner=ddp, flat or zero (stages 1 and 2: each island shards
its optimizer state, and gradients, over its K ranks). sync.mode=fsdp with islands is HSDP, FSDP2's own: it
shards inside each island and all-reduces the gradients' shards across every step (sharded/fsdp.py).
One island of N ranks with DiLoCo at outer lr 1 and no momentum is DDP; N islands of one are the per-rank
strategy (tests/sync/test_islands.py).
"""
from __future__ import annotations

from ddp_lab.config import ConfigError

ACROSS = ("diloco", "local_sgd")  # what runs across islands (sync.mode)
INSIDE = ("ddp", "flat", "zero")  # what runs inside them (sync.inner; zero at stage 1 or 2)


def across_islands(cfg) -> bool:
    """Whether the config runs a strategy inside islands and another across (IslandSync; HSDP is FSDP2's own)."""
    return str(cfg.islands) != "none" and cfg.mode != "fsdp"


def validate(cfg) -> None:
    """The rules of sync.islands and sync.inner, identically on every rank (the world size's: layout.py)."""
    islands, inner = str(cfg.islands), cfg.inner
    if islands == "none":
        if inner != "ddp":
            raise ConfigError(f"sync.inner={inner} is the strategy inside islands, and sync.islands=none makes "
                              f"none: set sync.islands=host (or K), or leave sync.inner out")
        return
    if cfg.mode == "fsdp":  # HSDP: FSDP2 itself shards inside and all-reduces across, every step
        if inner != "ddp":
            raise ConfigError(f"sync.mode=fsdp sync.islands={islands} is HSDP (FSDP2 shards inside each island and "
                              f"all-reduces across every step), which takes no sync.inner={inner}: leave sync.inner "
                              f"out, or use sync.mode=diloco with sync.inner={inner}")
        return
    if cfg.mode not in ACROSS:
        raise ConfigError(f"sync.islands={islands} runs sync.mode across islands, a periodic strategy, and "
                          f"sync.mode={cfg.mode} is not one: use sync.mode=diloco or local_sgd across (sync.inner="
                          f"{inner} averages every step inside each island), sync.mode=fsdp for HSDP, or "
                          f"sync.islands=none")
    if inner == "fsdp":
        raise ConfigError(f"sync.inner=fsdp under sync.mode={cfg.mode} is not built yet (the outer step works on "
                          f"whole tensors, FSDP2's are sharded): use sync.inner=zero with sync.zero_stage=1 or 2, "
                          f"or sync.mode=fsdp alone for HSDP")
    if inner == "zero" and getattr(cfg, "zero_stage", 1) == 3:
        raise ConfigError("sync.inner=zero with sync.zero_stage=3 is not built yet (the outer step reads whole "
                          "weights, which stage 3 frees between uses): use sync.zero_stage=1 or 2")
    if inner not in INSIDE:
        raise ConfigError(f"sync.inner={inner} inside islands is not one of {', '.join(INSIDE)}")
    if cfg.algo != "builtin":
        raise ConfigError(f"sync.islands={islands} runs torch's collectives on each island's process group: use "
                          f"sync.algo=builtin, not sync.algo={cfg.algo}")
    if cfg.mode == "local_sgd" and cfg.local_sgd_start_step:
        raise ConfigError(f"sync.local_sgd_start_step={cfg.local_sgd_start_step} averages gradients over every rank "
                          f"for its first steps, which islands leave to sync.inner: use sync.local_sgd_start_step=0")
