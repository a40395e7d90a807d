"""How the ring cuts and paces its messages (ddp_lab/collectives/tuned/ring.py: ring_plan),
from the TunedPlan it is handed. That the ring sums right under every plan is
checked in real processes in test_allreduce.py."""
from __future__ import annotations

import types

import pytest

from ddp_lab.collectives import TunedPlan
from ddp_lab.collectives.tuned import ring

REALTIME, NORMAL = TunedPlan(realtime_threads=True), TunedPlan(realtime_threads=False)
ACROSS_RT = TunedPlan(realtime_threads=True, across_hosts=True)


@pytest.mark.parametrize("size, tuned, batched, chunk_bytes, plan", [
    # plan: (segments, window, send_first, receives_ahead)
    (2, REALTIME, False, 4 << 20, (6, 2, False, False)),    # 768 KiB segments, 2 in flight
    (3, REALTIME, False, 100 << 10, (1, 1, False, False)),  # small chunk: one message
    (2, NORMAL, False, 4 << 20, (1, 1, True, False)),       # one message, pairwise send-first
    (2, TunedPlan(across_hosts=True), False, 4 << 20, (1, 1, True, True)),  # two hosts: receives ahead
    (8, ACROSS_RT, False, 512 << 10, (2, 2, False, False)),  # across hosts: a chunk cut in two
    (8, ACROSS_RT, False, 2 << 20, (3, 2, False, False)),    # ... or in 768 KiB segments
    (8, ACROSS_RT, False, 384 << 10, (1, 1, False, False)),  # ... not below 256 KiB a segment
    (3, NORMAL, False, 10 << 20, (3, 3, True, True)),       # 4 MiB segments, receives ahead
    (3, TunedPlan(segment_bytes=1 << 20), False, 10 << 20, (10, 10, True, True)),  # the plan's size
    (4, REALTIME, True, 64 << 20, (1, 1, False, False)),    # NCCL: one message per chunk
])
def test_ring_plan(size, tuned, batched, chunk_bytes, plan):
    comm = types.SimpleNamespace(size=size, batched=batched)
    got = ring.ring_plan(comm, tuned, chunk_bytes // 4, 4)
    assert tuple(got) == plan
    assert 1 <= got.window <= got.segments  # unit u sends what unit u-segments received
