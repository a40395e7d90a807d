"""Shared by the sync tests: a sync config without Hydra."""
from types import SimpleNamespace


def sync_cfg(mode="ddp", algo="builtin", compress="none", bucket_cap_mb=0.1, **extra):
    """A sync config; 0.1 MB buckets split LeNet's 0.5 MB of gradients into several.
    (sync.poll is read at start-up by ddp_lab.tuning: the strategies get env.poll.)"""
    return SimpleNamespace(mode=mode, algo=algo, compress=compress, bucket_cap_mb=bucket_cap_mb,
                           gradient_as_bucket_view=True, static_graph=False,
                           **{"shard_units": "auto", "unit_mb": 100.0, "prefetch": True, "reduce_dtype": "fp32",
                              "overlap": 0, "overlap_mix": 0.5, "fragments": 1, "overlap_update": "delayed",
                              "rounding": "nearest", "islands": "none", "inner": "ddp", **extra})
