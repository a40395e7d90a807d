"""The harness every multi-process test stands on (tests/multiproc.py): a
failing or hanging rank is reported by number, and the call returns
instead of waiting on it for ever."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch.distributed as dist

from tests.multiproc import run_in_processes


def _fail_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        raise RuntimeError("deliberate failure on rank one")
    dist.barrier()  # would wait forever for rank 1: the harness must kill it
    return rank


def test_harness_reports_the_failing_rank_and_does_not_hang():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed.*deliberate failure on rank one"):
        run_in_processes(_fail_on_rank_one, 2, timeout=60)


def _hang_on_rank_zero(rank: int, world_size: int):
    if rank == 0:
        time.sleep(600)
    return rank


def test_harness_times_out_and_kills_the_ranks():
    with pytest.raises(TimeoutError, match=r"ranks \[0\] of 2 did not finish"):
        run_in_processes(_hang_on_rank_zero, 2, timeout=3)


def _exit_silently_on_rank_one(rank: int, world_size: int):
    if rank == 1:
        os._exit(3)  # as a segfault or a kill would: no traceback, no result
    return rank


def test_harness_names_a_rank_that_died_without_a_result():
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 exited with code 3 without reporting a result"):
        run_in_processes(_exit_silently_on_rank_one, 2, timeout=60)


def _abort_in_teardown_on_rank_one(rank: int, world_size: int):
    if rank == 1:  # as torch's gloo teardown has done on a finished rank
        dist.destroy_process_group = lambda *a, **k: os.abort()
    return [rank] * 100_000  # larger than a pipe's buffer: it must arrive whole all the same


def test_a_rank_that_crashes_in_teardown_keeps_its_result_and_is_reported():
    aborted = rf"rank 1 of 2 reported its result, then exited with code -{signal.SIGABRT}"
    with pytest.warns(RuntimeWarning, match=aborted):
        values = run_in_processes(_abort_in_teardown_on_rank_one, 2, timeout=60)
    assert values == [[0] * 100_000, [1] * 100_000]
