"""Each attempt of a launch joins through a store prefix of its own.

Why: torchrun's c10d rendezvous lends its TCP store to the workers
(TORCHELASTIC_USE_AGENT_STORE=True), and that store outlives the workers:
after a restart (`--max-restarts`) it still holds the failed attempt's keys,
among them the addresses gloo's ranks published to connect to each other.
A restarted rank could read a dead peer's address and hang in
init_process_group, or fail with "Connection refused" (measured: 4 of 8
restarts after a SIGKILL went wrong; pytorch/pytorch#135712). torch keys
each attempt by TORCHELASTIC_RESTART_COUNT, but that count is each agent's
own: a healthy node's agent restarts its workers without counting it.

So rank 0 of every attempt names it with a fresh token, and the other ranks
make sure they hold *this* attempt's token, not a dead one's, before any
process-group key is written or read:

    rank 0:  set ddp_lab/attempt = T; for every rank r, wait for
             T/hello/r (a nonce, fresh per process) and echo it as T/welcome/r
    rank r:  read ddp_lab/attempt, write its nonce as hello, wait a moment
             for its own nonce to come back as welcome; if it does not (T was
             a dead attempt's), read ddp_lab/attempt again

Only rank 0 of the live attempt can echo a nonce that was made in this
attempt, so no rank ever proceeds on a stale token. The process group is
then built on the store under the prefix T: nothing of another attempt is
in sight. All of it is bounded by dist.timeout_s; past it the rank exits
with one line saying what it waited for (see Deadline).
"""
from __future__ import annotations

import datetime
import logging
import os
import queue
import threading
import time
import uuid

import torch.distributed as dist

from ddp_lab.config import error_file, say

log = logging.getLogger("ddp_lab")

ATTEMPT_KEY = "ddp_lab/attempt"
_attempt_store: dist.Store | None = None  # this process's, once init_process_group made it
GROUP_GRACE_S = 15  # the process group's timeout is dist.timeout_s plus this
POLL_S = 0.5  # how long a rank waits for its welcome before it looks for a newer attempt
CALL_S = 5.0  # the longest one store call may take before it is called unanswered


class Deadline:
    """Exit this process with one line if the block is still running after `seconds`.

    A rank blocked inside C++ (a store wait, gloo connecting) cannot be
    interrupted by an exception, so the timer ends the process itself:
    torchrun then sees it fail and stops or restarts the others. `what` says
    what the rank is waiting for and may be updated as it goes.
    """

    def __init__(self, seconds: float, rank: int, what: str):
        self.seconds, self.rank, self.what = seconds, rank, what
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def _expire(self) -> None:
        line = (f"ddp_lab: error: rank {self.rank} waited {self.seconds:g} s (dist.timeout_s) "
                f"for {self.what}; giving up")
        if logging.getLogger().handlers:  # the rank's log file, where Hydra set one up
            log.error(line)
        say(line)
        error_file.write(line)  # torchrun's root cause (ddp_lab.config.error_file)
        os._exit(1)

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()


def agent_store(timeout_s: float) -> dist.Store:
    """The store at MASTER_ADDR:MASTER_PORT: torchrun's own where it lends one,
    else hosted by rank 0 (as init_method env:// would)."""
    lent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                         is_master=rank == 0 and not lent,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def _open_attempt(store: dist.Store, world_size: int, deadline: Deadline) -> str:
    """Rank 0: a fresh token, and every other rank welcomed into it."""
    token = uuid.uuid4().hex[:12]
    store.set(ATTEMPT_KEY, token)
    waiting = set(range(1, world_size))
    while waiting:
        deadline.what = (f"rank(s) {', '.join(map(str, sorted(waiting)))} to join this attempt "
                         "(not started, or stuck before joining)")
        for r in sorted(waiting):
            if store.check([f"{token}/hello/{r}"]):
                store.set(f"{token}/welcome/{r}", store.get(f"{token}/hello/{r}"))
                waiting.discard(r)
        if waiting:
            time.sleep(0.05)
    return token


def _join_attempt(store: dist.Store, rank: int, deadline: Deadline) -> str:
    """Rank r > 0: the token of the attempt whose rank 0 echoes our nonce."""
    nonce = uuid.uuid4().hex.encode()
    deadline.what = "rank 0 to open this attempt (not started, or stuck before joining)"
    while True:
        token = store.get(ATTEMPT_KEY).decode()  # waits until a first attempt exists
        store.set(f"{token}/hello/{rank}", nonce)
        until = time.monotonic() + POLL_S
        while time.monotonic() < until:
            key = f"{token}/welcome/{rank}"
            if store.check([key]) and store.get(key) == nonce:
                return token
            time.sleep(0.02)


def init_process_group(backend: str, rank: int, world_size: int, timeout_s: float,
                       device_id=None) -> str:
    """dist.init_process_group on this attempt's own prefix of the store, all of it
    within timeout_s; returns the attempt's token."""
    # Loaded before the group exists: imported after it (a run's first model check does),
    # torch._dynamo keeps the group alive past destroy_process_group (it imports
    # torch.distributed.nn, whose functions default to the group of the moment), and its
    # gloo threads then run on while the interpreter shuts down (finished ranks aborted there).
    import torch._dynamo  # noqa: F401
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    with Deadline(timeout_s, rank, f"the rendezvous store at {where} (MASTER_ADDR:MASTER_PORT)") as deadline:
        store = agent_store(timeout_s)
        if rank == 0:
            token = _open_attempt(store, world_size, deadline)
        else:
            token = _join_attempt(store, rank, deadline)
        deadline.what = "the other ranks to connect (the process group's own handshake)"
        prefixed = dist.PrefixStore(f"ddp_lab/{token}", store)
        # The group's own timeout comes a little after dist.timeout_s, so that the
        # watchdog (ddp_lab.guards.watchdog), which names the missing ranks, speaks first.
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size,
                                device_id=device_id,
                                timeout=datetime.timedelta(seconds=timeout_s + GROUP_GRACE_S))
        if backend == "gloo":
            dist.barrier()  # every gloo thread has started and run once
    global _attempt_store
    _attempt_store = BoundedStore(prefixed, where)
    return token


def attempt_store() -> BoundedStore | None:
    """This attempt's store (under its own prefix), for the watchdog and preemption; None
    before init_process_group, or without one."""
    return _attempt_store


class StoreUnreachable(RuntimeError):
    """A store call did not return within its bound (or one before it is still stuck)."""


class BoundedStore:
    """A store whose every call returns within CALL_S (plus a wait's own timeout), or raises
    StoreUnreachable.

    Why: a TCPStore call blocks in a socket read that its timeout does not bound. On a host
    cut off from the network it waited until the link came back (measured on an emulated
    host: check() returned after 110 s, when the link was restored; TCP itself gives up
    after about 15 minutes). So the calls run on one thread of their own: a caller waits at
    most the bound, later callers fail at once while a call is stuck, and `unanswered_s`
    tells the watchdog how long the store has been silent.
    """

    def __init__(self, store: dist.Store, where: str = "?", call_s: float | None = None):
        self.store, self.where, self.call_s = store, where, CALL_S if call_s is None else call_s
        self._calls: queue.Queue = queue.Queue()
        self._since: float | None = None  # when the call in flight began
        self.answered_at = time.monotonic()  # when a call last returned
        self._worker = threading.Thread(target=self._serve, name="ddp_lab_store", daemon=True)
        self._worker.start()

    def unanswered_s(self) -> float:
        """How long the call in flight has waited (0 when none is)."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def _serve(self) -> None:
        while True:  # idle in a queue, not in C++, when the interpreter exits
            fn, args, box, done = self._calls.get()
            self._since = time.monotonic()
            try:
                box.append(("ok", fn(*args)))
            except Exception as e:  # handed to the caller
                box.append(("error", e))
            self._since, self.answered_at = None, time.monotonic()
            done.set()

    def _call(self, name: str, *args, wait_s: float = 0.0):
        if self.unanswered_s() > self.call_s:
            raise StoreUnreachable(f"the store at {self.where} has not answered for "
                                   f"{self.unanswered_s():.0f} s")
        box, done = [], threading.Event()
        self._calls.put((getattr(self.store, name), args, box, done))
        if not done.wait(self.call_s + wait_s):
            raise StoreUnreachable(f"the store at {self.where} did not answer {name}() within "
                                   f"{self.call_s + wait_s:g} s")
        kind, value = box[0]
        if kind == "error":
            raise value
        return value

    def set(self, key, value):
        return self._call("set", key, value)

    def get(self, key):
        return self._call("get", key)

    def check(self, keys):
        return self._call("check", keys)

    def compare_set(self, key, expected, desired):
        return self._call("compare_set", key, expected, desired)

    def wait(self, keys, timeout: datetime.timedelta):
        return self._call("wait", keys, timeout, wait_s=timeout.total_seconds())
