"""What a Trainer checkpoints, and how it takes it back.

Rank 0 saves the state every rank shares (state.pt): the model, the
optimizer, the schedule, the grad scaler, the place in the data, the
metrics so far, the gradient sync's shared state (PowerSGD's Q matrices,
DiLoCo's anchor and outer momentum) and the clock of a run to a target.
Every rank saves its own (rank<R>.pt): RNG states, the partial epoch's sums,
the sync's per-rank state (PowerSGD's error feedback) and, where the ranks'
weights differ between synchronisations (sync=local_sgd, diloco), its
own weights and optimizer state; under zero and fsdp, its shard of the
optimizer state; where the weights are sharded too (zero stage 3, fsdp), its
shards of the weights, and state.pt holds only what every rank holds whole
(buffers, frozen weights): no rank ever gathers the model to save or resume it.
At another world size (reshard.py) a rank's own RNG and
sums come back, and under zero and fsdp its shard of the optimizer state,
joined from every old rank's shards and cut again (reshard_zero_state,
FSDPSync.reshard_optimizer_state); a rank's own weights and optimizer state
(local_sgd, diloco) do not: every rank continues from rank 0's, and
PowerSGD's error feedback starts at zero.
"""
from __future__ import annotations

import logging

from ddp_lab.checkpoint.compat import config_diff, config_hash
from ddp_lab.checkpoint.reshard import stepped
from ddp_lab.checkpoint.rng import rng_state, set_rng_state
from ddp_lab.config import ConfigError

log = logging.getLogger("ddp_lab")


def shared_state(parts, model: dict) -> dict:
    """What rank 0 saves: everything every rank shares, asked of each part (training/builder.py's Parts);
    `model` is the whole model's state_dict (sync.model_state_dict: every rank calls it). Sharded
    optimizer state is each rank's own."""
    sync = parts.sync
    return {"model": model, "optimizer": {} if sync.caps.shards else parts.optimizer.state_dict(),
            "optimizer_layout": sync.optimizer_layout(),  # (what a resume under another sync mode reads)
            "scheduler": parts.scheduler.state_dict(), "scaler": parts.scaler.state_dict(),
            **parts.progress.state_dict(),  # step, epoch, batches_done, total_steps, last, world_sizes
            "sampler_seed": parts.info.seed, "world_size": parts.env.world_size,
            **parts.meter.state_dict(),  # epoch_seconds, epoch_elapsed_s
            "sync": sync.state_dict(), "target": parts.target.state_dict(sync.counts())}


def states(parts) -> tuple[dict | None, dict]:
    """(what rank 0 saves, None on the others; what this rank saves): every rank calls it at the same step."""
    model, own = _model_and_own(parts)
    if not parts.env.is_main:
        return None, own
    return _shared(parts, model), own


def _model_and_own(parts) -> tuple[dict, dict]:
    """(the model's state as state.pt holds it, this rank's own state; sharded weights: its shards in the own)."""
    sync, own = parts.sync, own_state(parts)
    if sync.caps.sharding == 3:  # the weights are cut N ways: each rank saves its own
        model, own["weights"] = sync.sharded_state(parts.model)
    else:
        model = sync.model_state_dict(parts.model)  # (every rank calls it)
    return model, own


def _shared(parts, model: dict) -> dict:
    return {**shared_state(parts, model), **({"weights_sharded": True} if parts.sync.caps.sharding == 3 else {})}


def peer_state(parts, config: dict) -> dict:
    """What this rank gives the rank of the same number in a joining island (sync.fault_tolerance=torchft): its
    checkpoint in memory, the shared part too (every island's rank sends its own at once), and the `config`
    that must match (checkpoint/compat.py's hashed part)."""
    model, own = _model_and_own(parts)
    return {"config": config, "shared": _shared(parts, model), "own": own}


def restore_from_peer(parts, state: dict, config: dict) -> None:
    """A peer's peer_state put back into this rank's parts, as a resume would; another config refused."""
    if config_hash(state["config"]) != config_hash(config):
        raise ConfigError("this island's config differs from the islands it joins (" +
                          "; ".join(config_diff(state["config"], config)) + "): launch it with theirs")
    restore(parts, state["shared"], state["own"])


def own_state(parts) -> dict:
    """What each rank saves for itself."""
    p = parts.progress
    own = {"rng": rng_state(parts.env.device), "step": p.step, "batches_done": p.batches_done,
           **parts.meter.own_state_dict(),  # sums
           "sync": parts.sync.own_state_dict()}
    if parts.sync.caps.diverges:  # (sharded weights inside islands: this rank's are its "weights" already)
        own.update(optimizer=parts.optimizer.state_dict(),
                   **({} if parts.sync.caps.sharding == 3 else {"model": parts.model.state_dict()}))
    elif parts.sync.caps.shards:  # (zero, fsdp) this rank's shard of the optimizer state
        own.update(optimizer=parts.optimizer.state_dict())
    if parts.sync.caps.shards:  # over how many ranks one copy is cut (islands, HSDP: an island's, ranks 0..K-1)
        own["shards_over"] = parts.sync.shards_over
    return own


# what a rank's own file holds that only the sync mode that wrote it reads
MODES_OWN = ("optimizer", "optimizers", "weights", "all_weights", "model", "sync", "shards_over")


def restore(parts, shared: dict, own: dict) -> None:
    """Put a checkpoint's state back into freshly built parts, each taking its own."""
    across = "whole" in shared
    if across:  # written under another sync mode: its weights and optimizer state whole, by name
        weights, optimizer = shared["whole"]
        try:
            parts.sync.load_model_state_dict(parts.model, _of_this_model(parts.model, weights))
        except ValueError as e:
            raise ConfigError(f"this checkpoint's weights do not fit this model ({e}): resume it with the model that "
                              f"wrote it") from None
        try:
            parts.sync.load_whole_optimizer_state(parts.optimizer, optimizer)
        except ValueError as e:
            raise ConfigError(f"this checkpoint's optimizer state does not fit this run's ({e})") from None
        own = {k: v for k, v in own.items() if k not in MODES_OWN}
        shared = {**shared, "sync": {}}
    else:
        _restore_model_and_optimizer(parts, shared, own)
    parts.scheduler.load_state_dict(shared["scheduler"])
    if across:  # the optimizer's groups are this mode's, fresh: their learning rate the schedule's now (one optim.lr)
        for group in parts.optimizer.param_groups:
            group["lr"] = parts.scheduler.get_last_lr()[0]
    parts.scaler.load_state_dict(shared["scaler"])
    parts.progress.load_state_dict(shared)  # step, epoch, batches_done, last, world_sizes
    parts.meter.load_state_dict(shared)
    parts.meter.load_own_state_dict(own)
    parts.sync.load_state_dict(shared.get("sync", {}), own.get("sync"))
    if "sync" not in own and (parts.sync.caps.diverges or parts.sync.own_state_dict()):  # another world size
        log.warning("resumed at another world size: every rank continues from rank 0's weights and optimizer "
                    "state, and PowerSGD's error feedback starts at zero (docs/bandwidth.md)%s",
                    "; islands sharded inside: from island 0's shards, DiLoCo's anchor from those weights and its "
                    "outer momentum at zero" if parts.sync.caps.diverges and parts.sync.caps.sharding == 3 else "")
    if "target" in shared:
        parts.target.load_state_dict(shared["target"])
    if shared["total_steps"] != parts.plan.total_steps and parts.info.lr_schedule == "cosine":
        log.warning("the cosine schedule was planned over %d steps, now over %d "
                    "(trainer.max_steps changed): the learning rate curve changes from here",
                    shared["total_steps"], parts.plan.total_steps)
    set_rng_state(own["rng"], parts.env.device)


def _of_this_model(model, weights):
    """`weights` (by every name the writing run's model had, read a tensor at a time), refused in one line where it
    lacks a name this model's state_dict has."""
    missing = [n for n in model.state_dict(keep_vars=True) if n not in weights]
    if missing:
        raise ConfigError(f"this checkpoint holds no {', '.join(missing[:3])}: resume it with the model that wrote it")
    return weights


def _restore_model_and_optimizer(parts, shared: dict, own: dict) -> None:
    """The model's and optimizer's state as the sync mode that wrote them holds them (this run's)."""
    if parts.sync.caps.shards:  # this rank's own shards (at another world size: every old rank's, cut again)
        reshard = getattr(parts.sync, "reshard_optimizer_state", None)
        if "optimizer" not in own and ("optimizers" not in own or reshard is None):
            raise ConfigError(f"this checkpoint holds the optimizer state in {shared['world_size']} shards, "
                              f"which this run cannot cut again: resume it at {shared['world_size']} ranks")
        saved_over, over = own.get("shards_over", shared["world_size"]), parts.sync.shards_over
        if "optimizer" in own and saved_over != over:  # (the same world size, other islands)
            raise ConfigError(f"this checkpoint's shards are cut over {saved_over} ranks, this run's over {over}: "
                              f"resume it with the sync.islands that wrote it")
        try:
            if "optimizer" not in own:
                own = {**own, "optimizer": reshard(own["optimizers"], parts.optimizer)}
            saved, steps = stepped(own["optimizer"]), stepped(parts.optimizer.state_dict())
            if saved != steps:  # (other buckets: another sync.bucket_cap_mb, or stage 1 before its buckets)
                raise ValueError(f"it steps {saved} shard(s) a rank, this run {steps}")
        except ValueError as e:
            raise ConfigError(f"this checkpoint's optimizer state does not fit this run's shards ({e}): resume "
                              f"it with the sync.zero_stage and sync.bucket_cap_mb that wrote it") from None
    if shared.get("weights_sharded"):  # this rank's own shards of the weights (another world size: its rows)
        try:
            parts.sync.load_sharded_state(parts.model, shared["model"], own.get("weights"), own.get("all_weights"))
        except ValueError as e:
            raise ConfigError(f"this checkpoint's weights do not fit this run's shards ({e}): resume it with "
                              f"the model and sync.shard_units that wrote it") from None
    else:  # the whole model (a checkpoint written before the weights were saved in shards, too)
        parts.sync.load_model_state_dict(parts.model, shared["model"])
    if not parts.sync.caps.shards:
        parts.optimizer.load_state_dict(shared["optimizer"])
    if "model" in own:  # this rank's own weights (at the same world size only)
        parts.model.load_state_dict(own["model"])
    if "optimizer" in own:  # its own optimizer state (local_sgd, diloco; zero, fsdp: its shard's)
        parts.optimizer.load_state_dict(own["optimizer"])
