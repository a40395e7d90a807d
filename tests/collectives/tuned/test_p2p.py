"""What the hand-written all-reduces keep between calls (ddp_lab/collectives/tuned/p2p.py):
host scratch buffers, prepared calls, and each group's Comm."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives import TunedPlan
from ddp_lab.collectives.tuned import p2p


def test_host_scratch_is_reused_grown_and_freed():
    like = torch.empty(0, dtype=torch.float32)
    first = p2p.scratch(1000, like)
    assert p2p.scratch(10, like).data_ptr() == first.data_ptr()  # reused
    assert p2p.scratch(10, like.double()).data_ptr() != first.data_ptr()  # per dtype
    assert p2p.scratch(10, like, "staging").data_ptr() != first.data_ptr()  # per purpose
    grown = p2p.scratch(5000, like)
    assert grown.numel() == 5000
    assert p2p.scratch(4000, like).data_ptr() == grown.data_ptr()
    p2p.free_scratch_buffers()
    assert p2p.per_thread.__dict__.get("buffers") is None


def test_prepared_calls_are_kept_per_buffer_group_and_plan_and_bounded():
    p2p.free_scratch_buffers()
    built = []

    def prepare(flat, comm, plan):
        built.append((flat.data_ptr(), flat.numel(), comm, plan))
        return len(built)

    comm, other_comm = object(), object()
    plan = TunedPlan()
    a = torch.zeros(12)
    first = p2p.prepared(a, comm, plan, prepare)
    assert p2p.prepared(a, comm, TunedPlan(), prepare) == first  # the same buffer and plan: kept
    assert p2p.prepared(a.view(3, 4).view(-1), comm, plan, prepare) == first  # same memory
    assert len(built) == 1
    assert p2p.prepared(a[:6], comm, plan, prepare) != first  # shorter
    assert p2p.prepared(a[6:], comm, plan, prepare) != first  # elsewhere
    assert p2p.prepared(a.view(torch.int32).float(), comm, plan, prepare) != first  # another tensor
    assert p2p.prepared(a, other_comm, plan, prepare) != first  # another group
    assert p2p.prepared(a, comm, TunedPlan(realtime_threads=True), prepare) != first  # another plan
    assert len(built) == 6 and built[-1][3] == TunedPlan(realtime_threads=True)
    # Least recently used first out: `a` with `plan` was used before the others above.
    for i in range(p2p.PREPARED_CALLS_KEPT):
        p2p.prepared(torch.zeros(3 + i), comm, plan, prepare)
    assert len(p2p.per_thread.prepared) == p2p.PREPARED_CALLS_KEPT
    assert p2p.prepared(a, comm, plan, prepare) != first  # dropped, prepared again
    p2p.free_scratch_buffers()
    assert p2p.per_thread.__dict__ == {}


def test_comm_is_kept_per_group_and_does_not_outlive_it(tmp_path):
    import gc

    def init(name):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / name}", rank=0, world_size=1)

    p2p.free_scratch_buffers()
    init("first")
    try:
        first = p2p.comm_of(None, batched=False)
        assert p2p.comm_of(None, batched=False) is first
        assert first.pg is dist.group.WORLD and (first.size, first.rank) == (1, 0)
        # Messages go to the gloo backend itself, not through the ProcessGroup.
        assert first.gloo is dist.group.WORLD._get_backend(torch.device("cpu"))
        assert type(first.gloo).__name__ == "ProcessGroupGloo"
    finally:
        dist.destroy_process_group()
    gc.collect()
    assert first.pg is None  # the kept Comm did not keep the destroyed group alive
    init("second")
    try:
        second = p2p.comm_of(None, batched=False)
        assert second is not first and second.pg is dist.group.WORLD
    finally:
        dist.destroy_process_group()
        p2p.free_scratch_buffers()


def test_comm_posts_on_the_process_group_where_no_backend_is_exposed():
    """comm.gloo falls back to the ProcessGroup itself: a torch without
    _get_backend, or a group with no CPU backend."""
    import types
    import weakref

    class Group:  # stands in for a ProcessGroup; weakref-able like one
        pass

    class NoCpuBackend(Group):
        def _get_backend(self, device):
            raise RuntimeError(f"no backend for {device}")

    for pg in (Group(), NoCpuBackend()):
        comm = types.SimpleNamespace(_pg=weakref.ref(pg))
        assert p2p.Comm.gloo.fget(comm) is pg
