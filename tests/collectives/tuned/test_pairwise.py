"""When pairwise exchanges post their receives first (ddp_lab/collectives/tuned/pairwise.py:
receives_first), from the TunedPlan they are handed. That naive and
halving-doubling sum right under both orders is checked in real processes in
test_allreduce.py."""
from __future__ import annotations

import types

import pytest
import torch

from ddp_lab.collectives import TunedPlan
from ddp_lab.collectives.tuned import pairwise

LIMIT = pairwise.EARLY_RECV_MAX_BYTES
REALTIME, NORMAL = TunedPlan(realtime_threads=True), TunedPlan(realtime_threads=False)
ACROSS = TunedPlan(across_hosts=True)


@pytest.mark.parametrize("size, plan, nbytes, first", [
    (2, REALTIME, 4096, True),       # real-time threads: always receives first
    (2, REALTIME, 4 * LIMIT, True),
    (4, REALTIME, 4 * LIMIT, True),
    (2, NORMAL, 4096, False),        # two ranks at normal priority: send first
    (3, NORMAL, LIMIT, True),        # 3+ ranks: receives first up to the limit
    (3, NORMAL, LIMIT + 4, False),   # and send first above it
    (2, ACROSS, 4 * LIMIT, True),    # ranks on two hosts: always receives first (both ways at once)
    (3, ACROSS, LIMIT + 4, True),
])
def test_receives_first(size, plan, nbytes, first):
    comm = types.SimpleNamespace(size=size)
    assert pairwise.receives_first(torch.empty(nbytes // 4), comm, plan) is first
