"""sync.islands: ranks in islands, every step averaged inside each (a fast link), a periodic strategy across
them (a slow one). The DiLoCo paper's setting and torchft's: many devices in a datacenter or host train as
one replica, and only the replicas exchange outer gradients.

    layout.py   which ranks form an island; the groups inside and across; the mean over islands, each rank
                sending its 1/K chunk across and the island gathering the chunks inside
    sync.py     IslandSync: the every-step strategy of sync/inner on the island's group, the periodic one
                sync=<name> chose across (DiLoCo, local SGD)

sync.islands=host: torchrun's node (LOCAL_WORLD_SIZE ranks); K: consecutive runs of K ranks; none (the
default): every rank on its own, as before. Inside: sync/inner=ddp (the default), flat, zero (each island shards
its model state over its K ranks, sync.inner.zero_stage deciding what) or fsdp, the strategies registered with
`inside=` (sync/registry.py); where the weights are sharded inside (stage 3, fsdp) each rank's outer gradient
is of its own shard, and it crosses whole (nothing is gathered inside). sync=fsdp with islands is HSDP, FSDP2's
own: it shards inside each island and all-reduces the gradients' shards across every step (sharded/fsdp.py).
One island of N ranks with DiLoCo at outer lr 1 and no momentum is DDP; N islands of one are the per-rank
strategy (tests/sync/test_islands.py).
"""
from __future__ import annotations


def across_islands(opts) -> bool:
    """Whether the options run a strategy inside islands and another across (IslandSync; HSDP is FSDP2's own)."""
    from ddp_lab.sync.periodic.periodic_options import PeriodicOptions  # (periodic/ builds on islands/layout.py)
    return isinstance(opts, PeriodicOptions) and str(opts.islands) != "none"
