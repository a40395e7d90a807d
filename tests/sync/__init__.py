"""Shared by the sync tests: a strategy's options, built from its schema (sync/registry.py)."""
import dataclasses

from ddp_lab.sync import REGISTRY
from ddp_lab.sync.registry import inner_options


def sync_cfg(mode="ddp", algo=None, compress=None, inner=None, **keys):
    """The options of sync=<mode> at the schema's defaults but for `keys` (and algo, compress where given);
    `inner`: the strategy inside islands, by name (its keys as inner_<key>). A key the strategy does not take is
    a TypeError, as Hydra would refuse it. Tests that split LeNet's 0.5 MB of gradients into several buckets say
    so (bucket_cap_mb=0.1)."""
    given = {k: v for k, v in (("algo", algo), ("compress", compress)) if v is not None}
    inside = {k[len("inner_"):]: keys.pop(k) for k in list(keys) if k.startswith("inner_")}
    if inner is not None or inside:
        given["inner"] = inner_options(inner or "ddp", **inside)
    opts = REGISTRY[mode].options
    known = {f.name for f in dataclasses.fields(opts)}
    unknown = sorted(set(given) - known - {"compress"} | set(keys) - known)
    if unknown:
        raise TypeError(f"sync={mode} takes no {', '.join(unknown)}")
    if "compress" in given and "compress" not in known:
        if given.pop("compress") != "none":
            raise TypeError(f"sync={mode} takes no compress")
    return opts(**given, **keys)
