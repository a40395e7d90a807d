"""The watchdog thread: publishes the place, ends a rank that makes no progress or lost its agent."""
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from ddp_lab.guards import stall, watchdog
from ddp_lab.guards.watchdog import Watchdog
from ddp_lab.telemetry import position


class _Store:
    """A dict with the three store calls the watchdog makes."""

    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)


@pytest.fixture(autouse=True)
def _fresh_place(monkeypatch):
    monkeypatch.setattr(position, "HERE", position.Place())


def test_the_watchdog_publishes_and_reads_places(monkeypatch, tmp_path):
    monkeypatch.setattr(watchdog, "PUBLISH_S", 0.05)
    store = _Store()
    store.set("place/1", '{"step": 3, "phase": "data loading", "inside": false, "seq": 0, '
                         '"collective": false, "time": 0}')
    dog = Watchdog(store, 0, 2, tmp_path, warn_s=60, timeout_s=120).start()
    try:
        position.at_step(4)
        with position.collective("gradient sync"):
            deadline = time.monotonic() + 5
            while b'"step": 4' not in store.data.get("place/0", b"") and time.monotonic() < deadline:
                time.sleep(0.02)
            places = dog.places()
    finally:
        dog.close()
    assert not dog._thread.is_alive()  # closed means gone: no store call left in flight at exit
    assert places[0]["step"] == 4 and places[0]["phase"] == "gradient sync" and places[0]["seq"] == 1
    assert places[1]["phase"] == "data loading" and places[1]["seq"] == 0
    assert stall.missing(places[0], places) == [1]  # no collective entered yet: not there


WATCHED = """
import sys, time
from ddp_lab.guards import watchdog
from ddp_lab.telemetry import position
watchdog.PUBLISH_S = 0.05
position.at_step(3)
position.phase(sys.argv[1])
watchdog.Watchdog(None, 0, 1, sys.argv[2], warn_s=0, timeout_s=0.5).start()
time.sleep(3)
print("still here")
"""


def test_no_progress_outside_a_collective_ends_the_rank_naming_its_phase(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", WATCHED, "data loading", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "still here" not in proc.stdout
    assert time.monotonic() - started < 3 + 10  # well before the sleep would have ended
    assert re.search(r"ddp_lab: error: rank 0 has made no progress for [01] s in data loading at "
                     r"step 3; giving up at dist.timeout_s=0.5; stacks in " + re.escape(
                         str(tmp_path / "stacks")), proc.stderr), proc.stderr
    assert 'File "<string>", line 9 in <module>' in (tmp_path / "stacks" / "rank0.txt").read_text()


def test_a_first_compile_has_no_timeout_of_its_own(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WATCHED, "compile", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "still here" in proc.stdout, proc.stderr


INSIDE = """
import sys, time
from ddp_lab.guards import watchdog
from ddp_lab.telemetry import position
watchdog.PUBLISH_S = 0.05
position.at_step(8)
watchdog.Watchdog(None, 0, 1, sys.argv[2], warn_s=0, timeout_s=0.5).start()
with position.collective("weight sync", own_timeout_s=float(sys.argv[1])):
    time.sleep(2)
print("still here", flush=True)
"""


def test_a_wait_with_a_timeout_of_its_own_is_given_that_much_more(tmp_path):
    # torchft's exchange across islands ends by its own timeout: the watchdog's comes after it
    mine = subprocess.run([sys.executable, "-c", INSIDE, "2.5", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert mine.returncode == 0 and "still here" in mine.stdout, mine.stderr
    plain = subprocess.run([sys.executable, "-c", INSIDE, "0", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 1 and "still here" not in plain.stdout
    assert "waited" in plain.stderr and "in weight sync at step 8" in plain.stderr, plain.stderr


ORPHAN = """
import os, sys, time
from ddp_lab.guards import watchdog
watchdog.PUBLISH_S = 0.05
watchdog.Watchdog(None, 1, 2, sys.argv[1], warn_s=0, timeout_s=300).start()
print("ready", flush=True)
time.sleep(60)
"""
AGENT = """
import os, signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE,
                         stderr=open(sys.argv[3], "w"))
assert child.stdout.readline() == b"ready\\n"
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
"""


def test_a_rank_whose_torchrun_agent_is_gone_stops_within_seconds(tmp_path):
    err = tmp_path / "rank1.err"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test"}
    agent = subprocess.run([sys.executable, "-c", AGENT, ORPHAN, str(tmp_path), str(err)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert agent.returncode == -9, agent.stderr
    pid, gone_at = int(agent.stdout.strip()), time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z" \
            and time.monotonic() < gone_at:
        time.sleep(0.05)
    assert time.monotonic() < gone_at, "the orphaned rank is still running"
    assert ("ddp_lab: error: rank 1: its torchrun agent (process" in err.read_text()
            and "is gone (killed, or out of memory) and nothing else would stop this rank; "
                "stopping now, writing no result" in err.read_text())


def test_a_rank_stopped_on_this_host_is_killed_when_the_others_give_up():
    """It cannot end itself, and torchrun's SIGTERM would wait in it for 30 s."""
    import signal
    import socket
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(3)]
    try:
        def where(p, start=None):
            fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
            return {"process": f"{socket.gethostname()}/{p.pid}/{start or fields[19]}"}

        stopped, running, reused = procs
        os.kill(stopped.pid, signal.SIGSTOP)
        os.kill(reused.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while open(f"/proc/{stopped.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T" \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        places = {0: None, 1: where(stopped), 2: where(running), 3: where(reused, start="1"),
                  4: {"process": "another-host/1/1"}}
        assert watchdog.end_stopped(places, [0, 1, 2, 3, 4]) == (
            "; rank 1 was stopped (SIGSTOP) on this host: killed it")
        assert stopped.wait(timeout=10) == -signal.SIGKILL
        assert running.poll() is None and reused.poll() is None  # not stopped / not the same process
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_first_rank_to_give_up_is_what_a_later_failure_quotes():
    import torch.distributed as dist
    store = dist.HashStore()
    assert watchdog.first_failure(None) is None and watchdog.first_failure(store) is None
    watchdog.note_failure(store, "rank 0 has waited 20 s in gradient sync at step 4")
    assert watchdog.first_failure(store) == "rank 0 has waited 20 s in gradient sync at step 4"


@pytest.mark.parametrize("rendezvous_answers", [False, True])
def test_a_rank_that_lost_its_store_ends_within_the_timeout(tmp_path, rendezvous_answers):
    """A host cut off from the network: every store call waits for the link. The rank ends
    at dist.timeout_s with a line naming the lost peers, whatever it was doing, and ends its
    torchrun agent (here a stand-in) only when the agent's rendezvous does not answer either."""
    rank = ("import sys, threading, time\n"
            "from ddp_lab.distributed import rendezvous\n"
            "from ddp_lab.telemetry import position\n"
            "from ddp_lab.guards import stall, watchdog\n"
            "watchdog.PUBLISH_S = 0.05\n"
            "rendezvous.CALL_S = 0.2\n"
            "class CutOff:\n"  # a store across a pulled cable: no call ever returns
            "    def set(self, key, value): threading.Event().wait()\n"
            "    def check(self, keys): threading.Event().wait()\n"
            "position.at_step(5)\n"
            "position.phase('forward/backward')\n"  # computing: no collective to time out in
            "watchdog.Watchdog(CutOff(), 2, 3, sys.argv[1], warn_s=0, timeout_s=1.5).start()\n"
            "time.sleep(20)\n"
            "print('still here')\n")
    agent = ("import subprocess, sys, time\n"
             "subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"
             "time.sleep(3)\n")
    with socket.socket() as rendezvous:
        rendezvous.bind(("127.0.0.1", 0))
        if rendezvous_answers:
            rendezvous.listen()
        endpoint = f"127.0.0.1:{rendezvous.getsockname()[1]}"
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", agent, rank, str(tmp_path),
                               f"--rdzv-endpoint={endpoint}"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "TORCHELASTIC_RUN_ID": "cut"})
    took = time.monotonic() - started
    assert "still here" not in proc.stdout and took < 15, (took, proc.stderr)  # not the sleep
    assert re.search(r"ddp_lab: error: rank 2 lost its peers: the store at \? has not answered for "
                     r"[12] s \(this host's network is down, or the store's host is gone\), at step 5 "
                     r"in forward/backward; giving up at dist.timeout_s=1.5", proc.stderr), proc.stderr
    ended = (r"; its torchrun agent \(process \d+\) cannot reach its rendezvous at "
             + re.escape(endpoint) + " either: ended it")
    if rendezvous_answers:  # the agent can go on: left alone, it ends by itself
        assert proc.returncode == 0 and not re.search(ended, proc.stderr), proc.stderr
    else:
        assert proc.returncode == -9 and re.search(ended, proc.stderr), proc.stderr


def _cpu_seconds(thread) -> float:
    """User + system CPU time of one thread of this process, from /proc."""
    fields = open(f"/proc/self/task/{thread.native_id}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_watchdog_without_a_store_sleeps_between_looks(tmp_path):
    """A rank alone under torchrun has no store: the watchdog still waits PUBLISH_S between
    looks (it used to wait 0 s, and spun a core for as long as the rank lived)."""
    dog = Watchdog(None, 0, 1, tmp_path, warn_s=0, timeout_s=300).start()
    try:
        time.sleep(0.2)
        before = _cpu_seconds(dog._thread)
        time.sleep(1.0)
        busy = _cpu_seconds(dog._thread) - before
    finally:
        dog.close()
    assert busy < 0.1, f"the watchdog thread used {busy:.2f} s of CPU in 1 s"
