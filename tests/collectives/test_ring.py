"""How the ring cuts and paces its messages (ddp_lab/collectives/ring.py: ring_plan).
That the ring sums right under every plan is checked in real processes in
test_allreduce.py."""
from __future__ import annotations

import types

import pytest

from ddp_lab.collectives import ring


@pytest.mark.parametrize("size, threads, batched, chunk_bytes, plan", [
    # plan: (segments, window, send_first, receives_ahead)
    (2, "realtime", False, 4 << 20, (6, 2, False, False)),    # 768 KiB segments, 2 in flight
    (3, "realtime", False, 100 << 10, (1, 1, False, False)),  # small chunk: one message
    (2, "normal", False, 4 << 20, (1, 1, True, False)),       # one message, pairwise send-first
    (3, "normal", False, 10 << 20, (3, 3, True, True)),       # 4 MiB segments, receives ahead
    (4, "realtime", True, 64 << 20, (1, 1, False, False)),    # NCCL: one message per chunk
])
def test_ring_plan(size, threads, batched, chunk_bytes, plan):
    comm = types.SimpleNamespace(size=size, threads=threads, batched=batched)
    got = ring.ring_plan(comm, chunk_bytes // 4, 4)
    assert tuple(got) == plan
    assert 1 <= got.window <= got.segments  # unit u sends what unit u-segments received
