"""sync.overlap_reduce=false (stages 2 and 3): each gradient reduce-scatter waited for where it is sent.

A GPT of 3 blocks on 2 ranks trains 2 steps under direct with and without it, at stage 2 (buckets of a block
or less) and at stage 3 (a unit a block). The same collectives run in the same order and sum the same numbers,
so the weights must be equal to the bit and the bytes counted equal. With it on (the default) a gradient hook
finds reduce-scatters still under way (the buckets sent before, left travelling while the backward goes on: at
most 2 at stage 2, 1 at stage 3);
with it off none ever does: the buffers of a bucket are gone before the next one's gradients are made.
"""
from __future__ import annotations

import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.models.gpt import gpt
from ddp_lab.sync import build_sync
from tests.multiproc import run_in_processes
from tests.sync import gpt_steps, sync_cfg, weights_sha1

STEPS = 2


def _run(rank: int, world_size: int) -> dict:
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    tokens = torch.randint(0, 16, (STEPS, 4, 9), generator=torch.Generator().manual_seed(rank))
    out = {}
    for stage in (2, 3):
        for overlap in (True, False):
            torch.manual_seed(0)
            model = gpt(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16)
            sync = build_sync(sync_cfg("zero", "direct", zero_stage=stage, bucket_cap_mb=0.002,
                                       overlap_reduce=overlap), model, env)
            seen, ready = [], sync._grad_ready

            def counted(p, sync=sync, ready=ready, seen=seen):
                seen.append(len(sync.in_flight))
                ready(p)
            for h in sync.hooks:
                h.remove()
            sync.hooks = [p.register_post_accumulate_grad_hook(counted) for p in model.parameters() if p.requires_grad]
            gpt_steps(sync, tokens)
            out[stage, overlap] = {"sha1": weights_sha1(sync, model), "wire_bytes": sync.wire_bytes,
                                   "most_in_flight": max(seen), "buckets": len(sync.buckets),
                                   "left": len(sync.in_flight), "describe": sync.describe()}
    return out


def test_waiting_for_each_reduce_scatter_takes_the_same_steps_with_none_left_travelling():
    ranks = run_in_processes(_run, 2, timeout=120)
    for r in ranks:
        for stage in (2, 3):
            on, off = r[stage, True], r[stage, False]
            assert on["buckets"] >= 4  # the blocks' and the embedding's: several sent in one backward
            assert off["sha1"] == on["sha1"] == ranks[0][stage, True]["sha1"]
            assert off["wire_bytes"] == on["wire_bytes"]
            assert on["most_in_flight"] == {2: 2, 3: 1}[stage]  # the buckets before, still travelling (the bound)
            assert off["most_in_flight"] == 0
            assert on["left"] == off["left"] == 0  # the backward's end landed every one
            assert (on["describe"], off["describe"]) == (f"zero{stage}/direct", f"zero{stage}/direct+wait")
