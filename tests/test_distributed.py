"""Process-group setup: dist.comm_threads puts gloo's threads, and only them, at real-time priority."""
import logging
import os
import threading

import pytest
import torch
import torch.distributed as dist

from ddp_lab import distributed
from ddp_lab.collectives import p2p, ring
from ddp_lab.config import ConfigError
from tests.conftest import NamedThread, may_use_realtime
from tests.multiproc import run_in_processes

CPU = torch.device("cpu")


@pytest.fixture
def threads():
    made = []
    yield lambda name, delay_s=0.0: made.append(NamedThread(name, delay_s)) or made[-1]
    for t in made:
        t.close()


linux_only = pytest.mark.skipif(not os.path.isdir("/proc/thread-self"), reason="thread names come from Linux /proc")


def test_unknown_value_names_the_choices():
    with pytest.raises(ConfigError, match=r"dist.comm_threads='fast' is not one of auto, realtime, normal"):
        distributed.setup("auto", "cpu", 60, "fast")


def test_realtime_is_refused_for_nccl_and_auto_leaves_it_alone():
    with pytest.raises(ConfigError, match="schedules gloo's threads, but this run uses nccl"):
        distributed.schedule_comm_threads("realtime", "nccl", torch.device("cuda", 0), set())
    assert distributed.schedule_comm_threads("auto", "nccl", torch.device("cuda", 0), set()) == "normal"
    assert distributed.schedule_comm_threads("auto", "gloo", torch.device("cuda", 0), set()) == "normal"


def test_at_comm_priority_matches_the_groups_threads(monkeypatch):
    if not may_use_realtime():
        pytest.skip("this process may not use SCHED_FIFO")
    monkeypatch.setattr(distributed, "_comm_threads_of_group", "normal")
    with distributed.at_comm_priority():
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    monkeypatch.setattr(distributed, "_comm_threads_of_group", "realtime")
    with distributed.at_comm_priority():
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
        with distributed.at_comm_priority():  # nested: no change, and no early restore
            pass
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    with pytest.raises(RuntimeError, match="inside"):
        with distributed.at_comm_priority():
            raise RuntimeError("inside")
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # restored on the way out of an error


def test_teardown_forgets_the_threads_priority(monkeypatch):
    monkeypatch.setattr(distributed, "_comm_threads_of_group", "realtime")
    distributed.teardown()  # no group here; the next one's threads start at normal priority
    assert distributed.comm_threads_of_group() == "normal"


@linux_only
def test_gloo_threads_waits_for_the_names_and_keeps_only_gloos(threads):
    late = threads("pt_gloo_runloop", delay_s=0.2)
    loop = threads("gloo_tcp_loop")
    other = threads("writer")
    for t in (loop, other):
        t.named.wait()
    found = distributed.gloo_threads({late.tid, loop.tid, other.tid}, wait_s=0.1)
    # `other` keeps a non-gloo name, so the wait runs out before `late` is named...
    assert found == [loop.tid]
    # ...while with time to spare every gloo thread is found.
    assert sorted(distributed.gloo_threads({late.tid, loop.tid, other.tid}, wait_s=5)) == sorted(
        [late.tid, loop.tid])


@linux_only
def test_without_permission_auto_warns_and_realtime_fails(threads, monkeypatch, caplog):
    loop = threads("gloo_tcp_loop")
    loop.named.wait()

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.WARNING):
        assert distributed.schedule_comm_threads("auto", "gloo", CPU, {loop.tid}) == "normal"
    assert "could not give gloo's threads real-time priority" in caplog.text
    assert "dist.comm_threads=normal silences this" in caplog.text
    with pytest.raises(ConfigError, match=r"CAP_SYS_NICE \(docker run --cap-add=SYS_NICE\)"):
        distributed.schedule_comm_threads("realtime", "gloo", CPU, {loop.tid})


@linux_only
def test_no_gloo_thread_found_is_reported(threads):
    other = threads("writer")
    other.named.wait()
    with pytest.raises(ConfigError, match="found no gloo threads"):
        distributed.schedule_comm_threads("realtime", "gloo", CPU, {other.tid})


@linux_only
def test_set_fifo_is_all_or_nothing(threads, monkeypatch):
    if not may_use_realtime():
        pytest.skip("this process may not use SCHED_FIFO")
    first, second = threads("gloo_a"), threads("gloo_b")
    real = os.sched_setscheduler

    def refuse_the_second(tid, policy, param):
        if tid == second.tid and policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")
        return real(tid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", refuse_the_second)
    with pytest.raises(PermissionError):
        distributed.set_fifo([first.tid, second.tid], 1)
    assert os.sched_getscheduler(first.tid) == os.SCHED_OTHER  # put back
    assert os.sched_getscheduler(second.tid) == os.SCHED_OTHER


def _schedule(rank, world_size, requested):
    me = threading.get_native_id()
    # The harness has already built the group: every other thread is its.
    got = distributed.schedule_comm_threads(requested, "gloo", CPU, distributed.thread_ids() - {me})
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    # The hand-written algorithms call gloo's send/recv from this thread: for the call it
    # takes the priority gloo's threads have (see at_comm_priority), and gives it back.
    seen = []

    def ring_noting_priority(flat, comm):
        seen.append(os.sched_getscheduler(0))
        ring._ring(flat, comm)

    u = torch.full((1 << 18,), float(rank + 1))
    p2p.run_on_comm_device(u, None, ring_noting_priority)
    assert u[0].item() == 3.0
    policies = sorted((distributed.thread_name(tid), os.sched_getscheduler(tid))
                      for tid in distributed.thread_ids() if tid != me)
    return got, policies, os.sched_getscheduler(me), t[0].item(), seen[0]


@linux_only
def test_a_real_group_gets_realtime_gloo_threads_where_permitted():
    realtime = may_use_realtime()
    for requested in ("auto", "normal"):
        for got, policies, main_policy, total, ring_policy in run_in_processes(_schedule, 2, requested):
            assert total == 3.0  # the group still works
            assert main_policy == os.SCHED_OTHER  # the training thread is never changed
            names = [name for name, _ in policies]
            assert "gloo_tcp_loop" in names and "pt_gloo_runloop" in names
            expect_fifo = requested == "auto" and realtime
            assert got == ("realtime" if expect_fifo else "normal")
            want = os.SCHED_FIFO if expect_fifo else os.SCHED_OTHER
            assert all(policy == want for _, policy in policies), policies
            assert ring_policy == want  # the ring's thread ran at gloo's threads' priority
