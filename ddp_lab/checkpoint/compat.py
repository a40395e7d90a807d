"""Does a checkpoint fit this run? The same training math (config) and world size.

A checkpoint stores the part of the config that changes the training math,
and its hash; resuming under other values would continue a different run,
so it is refused with a message naming every differing key.
"""
from __future__ import annotations

import hashlib
import json

from omegaconf import OmegaConf

from ddp_lab.config import ConfigError

# The parts of the config that change the training math. Left out on
# purpose (NOT_HASHED): where the data and pretrained weights live and how they are read, how LeNet
# lays out its arithmetic, which kernels step the optimizer, how a rank waits for the allreduce (the same
# function either way), where a model's code lives (_target_); trainer.max_steps
# (stop early, continue later), logging, resume and checkpoint settings,
# dist.*. A checkpoint whose meta.json still holds such a key (written before
# it was left out) is compared without it.
HASHED_GROUPS = ("model", "data", "optim", "sync")
NOT_HASHED = {
    "model": ("_target_", "crop_unused_border", "pad_channels_to", "pretrained",  # (the weights it started from)
              "max_shard_mb"),  # (how hf/ is written)
    "data": ("root", "cache_dir", "download", "loader", "num_workers"),
    "optim": ("implementation",),  # (torch's kernels for the same math)
    "sync": ("poll", "lighthouse", "island", "min_islands", "island_timeout_s"),  # (torchft islands: where, who)
}
TRAINER_HASHED = ("epochs", "grad_accum", "amp", "loss")
# Models that compute the same function with the same weights (tested in float64):
# a checkpoint of one resumes as the other.
SAME_FUNCTION = {"lenet_fast": "lenet"}


def config_subset(cfg) -> dict:
    """The hashed part of `cfg` as plain values (it goes into meta.json as well)."""
    c = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    # the strategy, by its options' dataclass (sync=<name> picks it; auto and per_param share their keys)
    c["sync"] = {"options": getattr(OmegaConf.get_type(cfg.sync), "__name__", "dict"), **c["sync"]}
    sub = _without_unhashed({g: c[g] for g in HASHED_GROUPS})
    sub["trainer"] = {k: c["trainer"][k] for k in TRAINER_HASHED}
    sub["seed"] = c["seed"]
    return sub


def _without_unhashed(subset: dict) -> dict:
    """`subset` with the NOT_HASHED keys of its groups dropped, and the model named
    by the function it computes (a copy)."""
    out = {g: ({k: v for k, v in part.items() if k not in NOT_HASHED.get(g, ())}
               if isinstance(part, dict) else part)
           for g, part in subset.items()}
    if isinstance(out.get("model"), dict) and "name" in out["model"]:
        out["model"]["name"] = SAME_FUNCTION.get(out["model"]["name"], out["model"]["name"])
    return out


def config_hash(subset: dict) -> str:
    return hashlib.sha256(json.dumps(subset, sort_keys=True).encode()).hexdigest()[:16]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(saved: dict, now: dict) -> list[str]:
    """`key: <in checkpoint> -> <now>` for every hashed key that differs."""
    a, b = _flatten(saved), _flatten(now)
    missing = "(unset)"
    return [f"{k}: {a.get(k, missing)!r} in the checkpoint vs {b.get(k, missing)!r} now"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


# Checkpoints written before datasets were named by _target_ chose them by data.name
OLD_DATA_NAMES = {"fashion_mnist": "ddp_lab.datasets.fashion_mnist",
                  "synthetic": "ddp_lab.datasets.synthetic_images"}


# Checkpoints written while one sync group held every strategy's keys named the strategy by sync.mode: its
# options' class now, each key of today's strategy taken from the checkpoint where it held it (flat's buffers
# were its bucket_cap_mb), today's value where it did not (a key added since, at the value that trains alike)
OLD_SYNC_MODES = {"auto": "AutoOptions", "ddp": "DDPOptions", "flat": "FlatOptions", "per_param": "PerParamOptions",
                  "local_sgd": "LocalSGDOptions", "diloco": "DiLoCoOptions", "zero": "ZeroOptions",
                  "fsdp": "FSDPOptions"}

# keys added with dict samples and a user's loss, at their defaults (tuples, cross-entropy)
DATA_ADDED = {"input_key": "", "target_key": ""}
TRAINER_ADDED = {"loss": {"_target_": None}}


def _upgraded_sync(old: dict, now: dict) -> dict:
    """A sync group written with sync.mode, in today's keys (OLD_SYNC_MODES); `now`: this run's."""
    powersgd = old.get("compress") == "powersgd"
    old = {**old, "compress": "none"} if powersgd else old
    if old.get("mode") == "flat":
        old = {**old, "buffer_mb": old.get("bucket_cap_mb")}
    out = {"options": "PowerSGDOptions" if powersgd else OLD_SYNC_MODES.get(old.get("mode"), old.get("mode"))}
    for k, v in now.items():
        if k != "options":
            out[k] = old[k] if k in old and not isinstance(v, dict) else v
    return out


def _upgraded(saved: dict, now: dict | None = None) -> dict:
    """An older checkpoint's config as today's keys say the same thing: data.name as the
    dataset's _target_, the keys added since at the values that train the same way; `now`: this run's
    (a sync group written with sync.mode is read in its keys)."""
    data, optim = dict(saved.get("data", {})), dict(saved.get("optim", {}))
    if "name" in data and "_target_" not in data:
        name = data.pop("name")
        data["_target_"] = OLD_DATA_NAMES.get(name, name)
        data.setdefault("task", "auto")
        if name == "synthetic":
            data.setdefault("seed", saved.get("seed"))
        else:  # synthetic's own keys, which every data config used to hold
            for k in ("image_shape", "num_classes", "num_train", "num_test"):
                data.pop(k, None)
        optim.setdefault("warmup_steps", 0)
    sync = dict(saved.get("sync", {}))
    if "options" not in sync and "mode" in sync and now is not None:  # (before each strategy owned its keys)
        sync = _upgraded_sync(sync, now.get("sync", {}))
    data = {**DATA_ADDED, **data}
    trainer = {**TRAINER_ADDED, **saved.get("trainer", {})}
    return {**saved, "data": data, "optim": optim, "sync": sync, "trainer": trainer}


# The strategies whose state is the model and one optimizer's: a checkpoint of one resumes under another
# (whole_state.py reads it whole by parameter name, the new one cuts it its way). The periodic ones (ranks
# apart, an anchor, outer momentum) and islands resume under the strategy that wrote them.
MOVABLE = ("AutoOptions", "DDPOptions", "FlatOptions", "PerParamOptions", "ZeroOptions", "FSDPOptions")


def mode_of(sync: dict) -> str:
    """The sync mode a checkpoint's sync group names, as a user sets it (sync=zero sync.zero_stage=3)."""
    name = {v: k for k, v in OLD_SYNC_MODES.items()}.get(sync.get("options"), sync.get("options", "?"))
    return f"sync={name}" + (f" sync.zero_stage={sync['zero_stage']}" if name == "zero" else "")


def _movable(sync: dict) -> bool:
    return sync.get("options") in MOVABLE and str(sync.get("islands", "none")) == "none"


def validate(step_dir, meta: dict, subset: dict) -> bool:
    """Refuse a checkpoint of another training config. (Another world size is fine: see reshard.py.) True where
    only the sync group differs, between strategies that hold the model and one optimizer (MOVABLE): the run
    resumes across sync modes."""
    saved = _without_unhashed(_upgraded(meta["config"], subset))
    if config_hash(saved) == config_hash(subset):
        return False
    if (config_hash({**saved, "sync": None}) == config_hash({**subset, "sync": None})
            and _movable(saved.get("sync", {})) and _movable(subset["sync"])):
        return True
    diff = config_diff(saved, subset)
    raise ConfigError(
        f"cannot resume from {step_dir}: config hash differs (" + "; ".join(diff) + "). "
        "Either set those keys back to the checkpoint's values, or start a new run "
        "directory (hydra.run.dir=... or DDP_LAB_RUN_ID=<name>, with trainer.resume=none)")
