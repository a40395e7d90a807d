"""Each attempt joins through its own store prefix, whatever an earlier attempt left in the store."""
import datetime
import threading
import time

import torch.distributed as dist

from ddp_lab import rendezvous
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
    code = ("from ddp_lab.rendezvous import Deadline\nimport time\n"
            "with Deadline(0.5, 3, 'rank 0 to open this attempt'):\n    time.sleep(30)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("ddp_lab: error: rank 3 waited 0.5 s (dist.timeout_s) for "
                                   "rank 0 to open this attempt; giving up")
    assert time.monotonic() - start < 20
