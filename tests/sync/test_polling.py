"""sync.poll: ranks wait for the builtin allreduce by polling where env.poll (ddp_lab.tuning
decides it), DDP on its last bucket only."""
from __future__ import annotations

import threading

import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import polls
from ddp_lab.sync.every_step.ddp import polling_hook
from tests.sync import sync_cfg


def test_polling_hook_waits_for_the_last_bucket_only():
    class Bucket:
        def __init__(self, last):
            self.last = last

        def is_last(self):
            return self.last

    futures = []

    def hook(state, bucket):  # an allreduce that finishes 50 ms later, on another thread
        fut = torch.futures.Future()
        threading.Timer(0.05, fut.set_result, args=(bucket,)).start()
        futures.append(fut)
        return fut

    polling = polling_hook(hook)
    assert not polling(None, Bucket(last=False)).done()  # earlier buckets: back at once
    assert polling(None, Bucket(last=True)).done()       # the last: back when it is done
    futures[0].wait()


def test_polling_is_for_the_builtin_allreduce_where_the_tuning_says_so():
    def gloo_cpu(poll):
        return DistEnv(0, 2, 0, torch.device("cpu"), "gloo", poll=poll)

    assert polls(sync_cfg(), gloo_cpu(True))
    assert not polls(sync_cfg(), gloo_cpu(False))
    assert not polls(sync_cfg(algo="ring"), gloo_cpu(True))   # send/recv works cannot be polled
