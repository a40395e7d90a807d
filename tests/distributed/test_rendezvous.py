"""Each attempt joins through its own store prefix, whatever an earlier attempt left in the store."""
import datetime
import threading
import time

import pytest
import torch.distributed as dist

from ddp_lab.distributed import rendezvous
from tests.conftest import free_port


def _store(port, is_master=False):
    return dist.TCPStore("127.0.0.1", port, 3, is_master=is_master,
                         timeout=datetime.timedelta(seconds=20), wait_for_workers=False)


class _Deadline:
    what = ""


def _attempt(port, delays):
    """One attempt of 3 ranks, each starting after its delay; their tokens."""
    tokens = {}

    def rank(r):
        time.sleep(delays[r])
        store = _store(port)
        if r == 0:
            tokens[r] = rendezvous._open_attempt(store, 3, _Deadline())
        else:
            tokens[r] = rendezvous._join_attempt(store, r, _Deadline())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return tokens


def test_a_restart_never_takes_a_dead_attempts_token():
    port = free_port()
    server = _store(port, is_master=True)  # outlives the attempts, as torchrun's does
    first = _attempt(port, [0.0, 0.0, 0.0])
    assert len(set(first.values())) == 1 and len(first) == 3
    # the restart: ranks 1 and 2 come up before rank 0 and find the dead attempt's keys
    second = _attempt(port, [0.8, 0.0, 0.1])
    assert len(second) == 3 and len(set(second.values())) == 1
    assert second[0] != first[0]
    third = _attempt(port, [0.0, 0.5, 0.0])
    assert len(set(third.values())) == 1 and third[0] not in (first[0], second[0])
    del server


def test_the_deadline_names_what_it_waited_for(tmp_path):
    """A rank stuck past dist.timeout_s exits with one line (run in a child process)."""
    import subprocess
    import sys
    code = ("from ddp_lab.distributed.rendezvous import Deadline\nimport time\n"
            "with Deadline(0.5, 3, 'rank 0 to open this attempt'):\n    time.sleep(30)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("ddp_lab: error: rank 3 waited 0.5 s (dist.timeout_s) for "
                                   "rank 0 to open this attempt; giving up")
    assert time.monotonic() - start < 20


class _CutOff:
    """A store on a host whose cable was pulled: check() waits until the link is back."""

    def __init__(self):
        self.link_up = threading.Event()

    def check(self, keys):
        self.link_up.wait()
        return True

    def set(self, key, value):
        pass


def test_a_store_call_that_gets_no_answer_is_bounded_and_the_silence_measured():
    cut = _CutOff()
    store = rendezvous.BoundedStore(cut, "host0:29500", call_s=0.3)
    started = time.monotonic()
    with pytest.raises(rendezvous.StoreUnreachable, match=r"the store at host0:29500 did not answer "
                                                           r"check\(\) within 0.3 s"):
        store.check(["k"])
    assert 0.3 <= time.monotonic() - started < 2
    time.sleep(0.1)
    assert store.unanswered_s() >= 0.4  # the call still waits, off the caller's thread
    started = time.monotonic()
    with pytest.raises(rendezvous.StoreUnreachable, match="has not answered for"):
        store.set("k", "v")  # while one call is stuck, the next fails at once
    assert time.monotonic() - started < 0.1
    cut.link_up.set()  # the link back: the stuck call returns, the store answers again
    deadline = time.monotonic() + 5
    while store.unanswered_s() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.unanswered_s() == 0 and store.check(["k"]) is True


def test_a_store_error_reaches_the_caller_as_itself():
    class Failing:
        def get(self, key):
            raise KeyError(key)

    with pytest.raises(KeyError):
        rendezvous.BoundedStore(Failing(), call_s=1).get("missing")
