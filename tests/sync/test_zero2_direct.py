"""Stage 2 on the direct collectives (sync.algo=direct): the weights' all-gather left under way
after the optimizer step and waited for by the forward, bucket by bucket.

A GPT of 3 blocks on 2 ranks trains 3 steps under builtin and under direct. At 2 ranks a chunk's
sum is x0 + x1 either way (one addition, commutative in IEEE arithmetic), so the weights must be
equal to the bit, and the bytes counted equal. Under direct, right after each step every bucket's
all-gather is under way, and each module's forward pre-hook waits for its own buckets only: at
the forward's first module the others are still under way.
"""
from __future__ import annotations

import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.models.gpt import gpt
from ddp_lab.sync import build_sync
from tests.multiproc import run_in_processes
from tests.sync import gpt_steps, sync_cfg, weights_sha1

STEPS = 3


def _run(rank: int, world_size: int) -> dict:
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    tokens = torch.randint(0, 16, (STEPS, 4, 9), generator=torch.Generator().manual_seed(rank))
    out = {}
    for algo in ("builtin", "direct"):
        torch.manual_seed(0)
        model = gpt(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16)
        sync = build_sync(sync_cfg("zero", algo, zero_stage=2, bucket_cap_mb=0.002), model, env)
        seen = []  # at the forward's first module (its bucket, the tied embedding's, is the last)
        model.wte.register_forward_pre_hook(lambda *_, seen=seen, sync=sync: seen.append(len(sync.gathering)))
        under_way = []
        gpt_steps(sync, tokens, lambda sync=sync, under_way=under_way: under_way.append(len(sync.gathering)))
        out[algo] = {"sha1": weights_sha1(sync, model), "wire_bytes": sync.wire_bytes, "buckets": len(sync.buckets),
                     "under_way": under_way, "at_first_module": seen,
                     "left": len(sync.gathering)}
    return out


def test_direct_leaves_the_gather_to_the_forward_and_takes_builtins_steps():
    ranks = run_in_processes(_run, 2, timeout=120)
    for r in ranks:
        builtin, direct = r["builtin"], r["direct"]
        assert direct["sha1"] == builtin["sha1"] == ranks[0]["builtin"]["sha1"]
        assert direct["wire_bytes"] == builtin["wire_bytes"]
        n = direct["buckets"]
        assert n >= 4  # the blocks' buckets, and the embedding's
        assert builtin["under_way"] == [0] * STEPS  # torch's all-gather is done when after_step returns
        assert direct["under_way"] == [n] * STEPS  # every bucket's left under way
        # the first forward has nothing to wait for; each later one, at its first module, still has every
        # bucket under way but the embedding's, which the sync's own pre-hook (registered first) waited for
        assert direct["at_first_module"] == [0] + [n - 1] * (STEPS - 1)
        assert direct["left"] == 0  # whole_weights waited for the rest
