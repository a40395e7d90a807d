"""What a Trainer checkpoints, and how it takes it back.

Rank 0 saves the state every rank shares (state.pt): the model, the
optimizer, the schedule, the grad scaler, the place in the data, the
metrics so far, the gradient sync's shared state (PowerSGD's Q matrices,
DiLoCo's anchor and outer momentum) and the clock of a run to a target.
Every rank saves its own (rank<R>.pt): RNG states, the partial epoch's sums,
the sync's per-rank state (PowerSGD's error feedback) and, where the ranks'
weights differ between synchronisations (sync.mode=local_sgd, diloco), its
own weights and optimizer state; under zero and fsdp, its shard of the
optimizer state. At another world size no rank's own state but the RNG and
sums comes back (reshard.py): every rank continues from rank 0's weights and
optimizer state, and PowerSGD's error feedback starts at zero; zero's
optimizer shards are resharded, fsdp's refused.
"""
from __future__ import annotations

import logging

from ddp_lab.checkpoint.rng import rng_state, set_rng_state
from ddp_lab.config import ConfigError

log = logging.getLogger("ddp_lab")


def shared_state(tr, model: dict) -> dict:
    """What rank 0 saves: everything every rank shares; `model` is the whole model's state_dict
    (sync.model_state_dict: every rank calls it). Sharded optimizer state is each rank's own."""
    return {"model": model, "optimizer": {} if tr.sync.caps.shards else tr.optimizer.state_dict(),
            "scheduler": tr.scheduler.state_dict(), "scaler": tr.scaler.state_dict(),
            "step": tr.step, "epoch": tr.epoch, "batches_done": tr.batches_done,
            "sampler_seed": tr.cfg.seed, "world_size": tr.env.world_size,
            "total_steps": tr.total_steps, "last": dict(tr.last),
            "world_sizes": tr.world_sizes, **tr.meter.state_dict(),  # epoch_seconds, epoch_elapsed_s
            "sync": tr.sync.state_dict(), "target": tr.target.state_dict(tr.sync.counts())}


def own_state(tr) -> dict:
    """What each rank saves for itself."""
    own = {"rng": rng_state(tr.env.device), "step": tr.step,
           "batches_done": tr.batches_done, **tr.meter.own_state_dict(),  # sums
           "sync": tr.sync.own_state_dict()}
    if tr.sync.caps.diverges:
        own.update(model=tr.model.state_dict(), optimizer=tr.optimizer.state_dict())
    elif tr.sync.caps.shards:  # (zero, fsdp) this rank's shard of the optimizer state
        own.update(optimizer=tr.optimizer.state_dict())
    return own


def restore(tr, shared: dict, own: dict) -> None:
    """Put a checkpoint's state back into a freshly built Trainer."""
    if tr.sync.caps.shards:  # this rank's own shards (at another world size: every old rank's, cut again)
        reshard = getattr(tr.sync, "reshard_optimizer_state", None)
        if "optimizer" not in own and ("optimizers" not in own or reshard is None):
            raise ConfigError(f"this checkpoint holds the optimizer state in {shared['world_size']} shards, "
                              f"which this run cannot cut again: resume it at {shared['world_size']} ranks")
        try:
            if "optimizer" not in own:
                own = {**own, "optimizer": reshard(own["optimizers"], tr.optimizer)}
            saved, steps = len(own["optimizer"]["param_groups"][0]["params"]), len(tr.sync.parameters())
            if saved != steps:  # (other buckets: another sync.bucket_cap_mb, or stage 1 before its buckets)
                raise ValueError(f"it steps {saved} shard(s) a rank, this run {steps}")
        except ValueError as e:
            raise ConfigError(f"this checkpoint's optimizer state does not fit this run's shards ({e}): resume "
                              f"it with the sync.zero_stage and sync.bucket_cap_mb that wrote it") from None
    tr.sync.load_model_state_dict(tr.model, shared["model"])  # (sharded: each rank keeps its piece)
    if not tr.sync.caps.shards:
        tr.optimizer.load_state_dict(shared["optimizer"])
    tr.scheduler.load_state_dict(shared["scheduler"])
    tr.scaler.load_state_dict(shared["scaler"])
    tr.step, tr.epoch = shared["step"], shared["epoch"]
    tr.batches_done = shared["batches_done"]
    tr.last = dict(shared["last"])
    tr.meter.load_state_dict(shared)
    tr.meter.load_own_state_dict(own)
    if "model" in own:  # this rank's own weights (at the same world size only)
        tr.model.load_state_dict(own["model"])
    if "optimizer" in own:  # its own optimizer state (local_sgd, diloco; zero, fsdp: its shard's)
        tr.optimizer.load_state_dict(own["optimizer"])
    tr.sync.load_state_dict(shared.get("sync", {}), own.get("sync"))
    if "sync" not in own and (tr.sync.caps.diverges or tr.sync.own_state_dict()):  # another world size
        log.warning("resumed at another world size: every rank continues from rank 0's weights and optimizer "
                    "state, and PowerSGD's error feedback starts at zero (docs/bandwidth.md)")
    if "target" in shared:
        tr.target.load_state_dict(shared["target"])
    tr.world_sizes = [list(w) for w in shared.get("world_sizes", [[0, shared["world_size"]]])]
    if tr.world_sizes[-1][1] != tr.env.world_size:
        tr.world_sizes.append([tr.step, tr.env.world_size])
    if shared["total_steps"] != tr.total_steps and tr.cfg.optim.schedule == "cosine":
        log.warning("the cosine schedule was planned over %d steps, now over %d "
                    "(trainer.max_steps changed): the learning rate curve changes from here",
                    shared["total_steps"], tr.total_steps)
    set_rng_state(own["rng"], tr.env.device)
