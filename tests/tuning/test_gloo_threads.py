"""gloo's threads (ddp_lab/tuning/gloo_threads.py): found by their names, given real-time
priority all together or not at all, and the calling thread's priority for a block."""
import os
import threading

import pytest

from ddp_lab.tuning import gloo_threads
from tests.conftest import linux_only, needs_realtime


@linux_only
def test_gloo_threads_waits_for_the_names_and_keeps_only_gloos(threads):
    late = threads("pt_gloo_runloop", delay_s=0.2)
    loop = threads("gloo_tcp_loop")
    other = threads("writer")
    for t in (loop, other):
        t.named.wait()
    found = gloo_threads.gloo_threads({late.tid, loop.tid, other.tid}, wait_s=0.1)
    # `other` keeps a non-gloo name, so the wait runs out before `late` is named...
    assert found == [loop.tid]
    # ...while with time to spare every gloo thread is found.
    assert sorted(gloo_threads.gloo_threads({late.tid, loop.tid, other.tid}, wait_s=1.5)) == sorted(
        [late.tid, loop.tid])


@linux_only
@needs_realtime
def test_set_fifo_is_all_or_nothing(threads, monkeypatch):
    first, second = threads("gloo_a"), threads("gloo_b")
    real = os.sched_setscheduler

    def refuse_the_second(tid, policy, param):
        if tid == second.tid and policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")
        return real(tid, policy, param)

    monkeypatch.setattr(os, "sched_setscheduler", refuse_the_second)
    with pytest.raises(PermissionError):
        gloo_threads.set_fifo([first.tid, second.tid], 1)
    assert os.sched_getscheduler(first.tid) == os.SCHED_OTHER  # put back
    assert os.sched_getscheduler(second.tid) == os.SCHED_OTHER


@linux_only
@needs_realtime
def test_set_fifo_skips_a_thread_that_has_ended(threads):
    alive = threads("gloo_a")
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    gloo_threads.set_fifo([ended.native_id, alive.tid], 1)  # the ended thread's id names no thread now
    assert os.sched_getscheduler(alive.tid) == os.SCHED_FIFO
    os.sched_setscheduler(alive.tid, os.SCHED_OTHER, os.sched_param(0))


@linux_only
@needs_realtime
def test_a_gloo_thread_named_late_is_raised_by_the_second_look(threads):
    from ddp_lab import tuning

    early, late, other = threads("gloo_a"), threads("gloo_tcp_loop", delay_s=0.3), threads("writer")
    for t in (early, other):
        t.named.wait()
    found = gloo_threads.gloo_threads({early.tid, late.tid, other.tid}, wait_s=0.05)
    gloo_threads.set_fifo(found, 1)  # what start() gave at first: `late` was not named yet
    late.named.wait()
    assert gloo_threads.below_realtime([early.tid, late.tid]) == [late.tid]
    assert tuning.raise_late_threads() == [late.tid]
    assert [os.sched_getscheduler(t.tid) for t in (early, late, other)] == [
        os.SCHED_FIFO, os.SCHED_FIFO, os.SCHED_OTHER]
    for t in (early, late):
        os.sched_setscheduler(t.tid, os.SCHED_OTHER, os.sched_param(0))


@needs_realtime
def test_at_comm_priority_follows_what_it_is_told():
    with gloo_threads.at_comm_priority(False):
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    with gloo_threads.at_comm_priority(True):
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
        with gloo_threads.at_comm_priority(True):  # nested: no change, and no early restore
            pass
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    with pytest.raises(RuntimeError, match="inside"), gloo_threads.at_comm_priority(True):
        raise RuntimeError("inside")
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # restored on the way out of an error
