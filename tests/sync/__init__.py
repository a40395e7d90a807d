"""Shared by the sync tests: a sync config without Hydra."""
from types import SimpleNamespace


def sync_cfg(mode="ddp", algo="builtin", compress="none", bucket_cap_mb=0.1, poll=True, **extra):
    """A sync config; 0.1 MB buckets split LeNet's 0.5 MB of gradients into several."""
    return SimpleNamespace(mode=mode, algo=algo, compress=compress, bucket_cap_mb=bucket_cap_mb,
                           gradient_as_bucket_view=True, static_graph=False, poll=poll, **extra)
