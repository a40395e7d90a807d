"""Stage 3's prefetch (sync.prefetch): the next unit's gather started while this one computes.

A GPT of 3 blocks on 2 ranks trains 2 steps with and without it. The same collectives run in
the same order, so the weights must be the same to the bit and the bytes the same; with it,
every gather but the first of the forward and of the backward was found already under way,
and one unit more is whole at a time: two, where without it one is (besides the root, whose
gradients, a tied embedding's, end the backward).
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
    for prefetch in (False, True):
        torch.manual_seed(0)
        model = gpt(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16)
        sync = build_sync(sync_cfg("zero", "builtin", zero_stage=3, prefetch=prefetch), model, env)
        peak, gather = [0], sync._gather

        def counted(part, ahead=(), sync=sync, gather=gather, peak=peak):
            gather(part, ahead)
            whole = sum(v.gathered or id(v) in sync.pending for v in sync.units if v is not sync.root)
            peak[0] = max(peak[0], whole)
        sync._gather = counted  # (the hooks look it up when they run)
        gpt_steps(sync, tokens)
        sent, most = sync.wire_bytes, peak[0]
        out[prefetch] = {"sha1": weights_sha1(sync, model), "wire_bytes": sent, "prefetched": sync.prefetched,
                         "peak": most,
                         "units": len(sync.units) - (sync.root is not None), "pending": len(sync.pending)}
    return out


def test_prefetch_changes_neither_the_weights_nor_the_bytes_and_gathers_ahead():
    ranks = run_in_processes(_run, 2, timeout=120)
    for r in ranks:
        off, on = r[False], r[True]
        assert on["sha1"] == off["sha1"] == ranks[0][False]["sha1"]
        assert on["wire_bytes"] == off["wire_bytes"] > 0
        # units: the 3 blocks (the repeated class: sync.shard_units=auto); each step every one but the first
        # of the forward and of the backward found its gather started
        assert on["units"] == 3
        assert (off["prefetched"], on["prefetched"]) == (0, STEPS * 2 * (on["units"] - 1)), (off, on)
        # besides the root (the embeddings, final norm): one unit whole at a time, and with prefetch the next too
        assert (off["peak"], on["peak"]) == (1, 2), (off, on)
        assert on["pending"] == 0  # nothing left in flight after a step
