"""The harness every multi-process test stands on (tests/multiproc.py): a
failing or hanging rank is reported by number, and the call returns
instead of waiting on it for ever."""
from __future__ import annotations

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
