"""Shared by the sync tests: a strategy's options, built from its schema (sync/registry.py); the trainer's steps on
a small GPT and a digest of its weights."""
import dataclasses
import hashlib

import torch

from ddp_lab.sync import REGISTRY
from ddp_lab.sync.registry import inner_options
from ddp_lab.training.tasks import LANGUAGE_MODEL


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


def gpt_steps(sync, tokens: torch.Tensor, each_step=lambda: None) -> None:
    """The trainer's steps on the GPT inside `sync`, one per row of `tokens` (sequences of context + 1), with AdamW
    at 1e-2; each_step() after each."""
    opt = torch.optim.AdamW(sync.parameters(), lr=1e-2)
    for step, batch in enumerate(tokens, 1):
        LANGUAGE_MODEL.loss(sync.module(batch[:, :-1]), batch[:, 1:]).backward()
        sync.after_backward()
        opt.step()
        opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
        sync.after_step(step)
        each_step()


def weights_sha1(sync, model: torch.nn.Module) -> str:
    """The digest of the model's whole weights (gathered, where the sync shards them)."""
    with sync.whole_weights():
        return hashlib.sha1(b"".join(p.detach().clone().numpy().tobytes() for p in model.parameters())).hexdigest()
