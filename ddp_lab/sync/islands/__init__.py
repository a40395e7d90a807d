"""sync.islands: ranks in islands, every step averaged inside each (a fast link), a periodic strategy across
them (a slow one). The DiLoCo paper's setting and torchft's: many devices in a datacenter or host train as
one replica, and only the replicas exchange outer gradients.

    layout.py   which ranks form an island; the groups inside and across; the mean over islands, each rank
                sending its 1/K chunk across and the island gathering the chunks inside
    sync.py     IslandSync: the every-step strategy of sync.inner on the island's group, sync.mode's
                periodic one across (DiLoCo, local SGD)

sync.islands=host: torchrun's node (LOCAL_WORLD_SIZE ranks); K: consecutive runs of K ranks; none (the
default): every rank on its own, as before. sync.inner=ddp, flat, zero (each island shards its model state
over its K ranks, sync.zero_stage deciding what) or fsdp; where the weights are sharded inside (stage 3, fsdp)
each rank's outer gradient is of its own shard, and it crosses whole (nothing is gathered inside).
sync.mode=fsdp with islands is HSDP, FSDP2's own: it shards inside each island and all-reduces the gradients'
shards across every step (sharded/fsdp.py).
One island of N ranks with DiLoCo at outer lr 1 and no momentum is DDP; N islands of one are the per-rank
strategy (tests/sync/test_islands.py).
"""
from __future__ import annotations

from ddp_lab.config import ConfigError

ACROSS = ("diloco", "local_sgd")  # what runs across islands (sync.mode)
INSIDE = ("ddp", "flat", "zero", "fsdp")  # what runs inside them (sync.inner)


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
    if inner not in INSIDE:
        raise ConfigError(f"sync.inner={inner} inside islands is not one of {', '.join(INSIDE)}")
    if cfg.algo != "builtin":
        raise ConfigError(f"sync.islands={islands} runs torch's collectives on each island's process group: use "
                          f"sync.algo=builtin, not sync.algo={cfg.algo}")
    if cfg.mode == "local_sgd" and cfg.local_sgd_start_step:
        raise ConfigError(f"sync.local_sgd_start_step={cfg.local_sgd_start_step} averages gradients over every rank "
                          f"for its first steps, which islands leave to sync.inner: use sync.local_sgd_start_step=0")
