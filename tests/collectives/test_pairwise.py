"""When pairwise exchanges post their receives first (ddp_lab/collectives/pairwise.py:
receives_first). That naive and halving-doubling sum right under both orders is
checked in real processes in test_allreduce.py."""
from __future__ import annotations

import types

import pytest
import torch

from ddp_lab.collectives import pairwise

LIMIT = pairwise.EARLY_RECV_MAX_BYTES


@pytest.mark.parametrize("size, threads, nbytes, first", [
    (2, "realtime", 4096, True),       # real-time threads: always receives first
    (2, "realtime", 4 * LIMIT, True),
    (4, "realtime", 4 * LIMIT, True),
    (2, "normal", 4096, False),        # two ranks at normal priority: send first
    (3, "normal", LIMIT, True),        # 3+ ranks: receives first up to the limit
    (3, "normal", LIMIT + 4, False),   # and send first above it
])
def test_receives_first(size, threads, nbytes, first):
    comm = types.SimpleNamespace(size=size, threads=threads)
    assert pairwise.receives_first(torch.empty(nbytes // 4), comm) is first
