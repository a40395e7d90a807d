"""The stall inspector's reports: who has not arrived, a desync, why a rank stopped."""
import os
import socket
import subprocess
import time

import pytest

from ddp_lab.guards import stall
from ddp_lab.telemetry import position


def _place(step, phase, inside, ago=0.0, seq=10, collective=None):
    return {"step": step, "phase": phase, "inside": inside, "seq": seq,
            "collective": inside if collective is None else collective, "time": time.time() - ago}


def test_a_waiting_rank_names_the_ranks_that_have_not_arrived():
    places = {0: _place(120, "gradient sync", True), 1: _place(120, "data loading", False, ago=75, seq=9),
              2: _place(120, "gradient sync", True), 3: None}
    assert stall.missing(places[0], places) == [1, 3]
    assert stall.stall_report(0, 61.2, places) == (
        "rank 0 has waited 61 s in gradient sync at step 120 for rank 1 (in data loading at "
        "step 120, 75 s ago); rank 3 (never seen)")


def test_a_rank_in_another_collective_with_the_same_count_is_a_desync():
    places = {0: _place(5, "gradient sync", True), 1: _place(5, "loss check", True, ago=30)}
    assert stall.stall_report(0, 30, places) == (
        "rank 0 has waited 30 s in gradient sync at step 5 for rank 1 (waiting in loss check "
        "at step 5, 30 s ago): the ranks are out of step (a rank skipped or added a "
        "collective: a desync)")
    places[1] = _place(6, "gradient sync", True, seq=11)  # went past a collective rank 0 waits in
    assert "a desync" in stall.stall_report(0, 30, places)


def test_a_rank_computing_or_in_an_earlier_collective_is_late_not_a_desync():
    for other in (_place(5, "forward/backward", False, seq=9),
                  _place(5, "evaluation buffers", True, seq=9),  # its stale, last published place
                  _place(4, "gradient sync", False, seq=9)):  # left step 4's, then stopped
        places = {0: _place(5, "gradient sync", True), 1: other}
        assert stall.missing(places[0], places) == [1]
        assert "desync" not in stall.stall_report(0, 30, places)
    left = _place(5, "gradient sync", False, seq=10)  # has just left the one rank 0 is in
    assert stall.missing(_place(5, "gradient sync", True), {1: left}) == []


def test_each_phase_of_a_save_has_its_own_name():
    """Rank 0 stopped while writing; rank 1 waits in the agreement after the writes."""
    places = {0: _place(10, "checkpoint step-10: writing rank0.pt and state.pt", False, ago=20,
                        seq=20),
              1: _place(10, "checkpoint step-10: files written", True, seq=21)}
    assert stall.stall_report(1, 20, places) == (
        "rank 1 has waited 20 s in checkpoint step-10: files written at step 10 for rank 0 "
        "(in checkpoint step-10: writing rank0.pt and state.pt at step 10, 20 s ago)")


def test_the_training_thread_marks_its_place():
    position.at_step(7)
    position.phase("evaluation")
    assert stall.why_stopped(0, "SIGTERM", None) == "rank 0 stopped at step 7 in evaluation: SIGTERM"
    seq = position.HERE.seq
    with position.collective("evaluation counts"):
        assert (position.HERE.step, position.HERE.phase, position.HERE.inside) == (7, "evaluation counts", True)
        assert position.HERE.seq == seq + 1
        assert stall.why_stopped(2, "RuntimeError: Connection closed by peer", None) == (
            "rank 2 stopped at step 7 in evaluation counts: RuntimeError: Connection closed by peer")
    assert not position.HERE.inside
    assert stall.why_stopped(0, "SIGTERM", None) == "rank 0 stopped at step 7 after evaluation counts: SIGTERM"


def test_a_compiled_models_first_step_is_named_compile():
    """A rank stopped while its kernels build is named "in compile" (the stopped-rank tests above name
    the other phases through torchrun; a real compile there cost the suite 50 s)."""
    from types import SimpleNamespace

    from ddp_lab.training.callbacks import PositionMarks
    marks = PositionMarks()
    for compiled, stepped, phase in ((True, False, "compile"), (True, True, "forward/backward"),
                                     (False, False, "forward/backward")):
        marks.step_start(SimpleNamespace(step=0, compiled=compiled, stepped=stepped), micro=[])
        assert (position.HERE.step, position.HERE.phase) == (1, phase)
        assert stall.why_stopped(1, "SIGSTOP", None) == f"rank 1 stopped at step 1 in {phase}: SIGSTOP"


def test_stacks_are_written_per_rank(tmp_path):
    path = stall.dump_stacks(tmp_path, 3)
    assert path == tmp_path / "stacks" / "rank3.txt"
    assert "test_stacks_are_written_per_rank" in path.read_text()
    (tmp_path / "file").write_text("x")
    assert stall.dump_stacks(tmp_path / "file", 0) is None  # cannot: no crash either


@pytest.fixture(autouse=True)
def _fresh_place(monkeypatch):
    monkeypatch.setattr(position, "HERE", position.Place())


# ---------------------------------------------------------------- a rank that is gone
class _Watchdog:
    def __init__(self, places):
        self._places = places

    def places(self):
        return self._places


def _in_gradient_sync_at_41(peer_process: str, cause: str, name_lost: bool = True) -> str:
    """Rank 0's line, stopped in step 41's gradient sync, rank 1 last seen in step 36's."""
    position.at_step(41)
    with pytest.raises(RuntimeError), position.collective("gradient sync"):
        raise RuntimeError(cause)
    me = {**position.HERE.as_dict(), "seq": 80}
    peer = {**_place(36, "gradient sync", True, ago=2, seq=70), "process": peer_process}
    return stall.why_stopped(0, cause, _Watchdog({0: me, 1: peer}), name_lost)


def _ended_process(reap: bool) -> tuple[subprocess.Popen, str]:
    """A process of this host that has ended (`reap` False: a zombie not yet reaped, as a
    rank is until its torchrun agent looks), and its identity as it published it."""
    proc = subprocess.Popen(["sleep", "30"])
    identity = f"{socket.gethostname()}/{proc.pid}/{position.process_state(proc.pid)[1]}"
    proc.kill()
    if reap:
        proc.wait()
    else:
        while position.process_state(proc.pid)[0] != "Z":
            time.sleep(0.01)
    return proc, identity


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_a_rank_whose_process_ended_on_this_host_is_named_first(reap):
    proc, identity = _ended_process(reap)
    try:
        line = _in_gradient_sync_at_41(identity, "RuntimeError: Connection reset by peer")
    finally:
        proc.wait()
    assert line == ("rank 0 stopped at step 41 in gradient sync: rank 1 is gone (its process "
                    "ended; last seen waiting in gradient sync at step 36, 2 s ago); this rank "
                    "got RuntimeError: Connection reset by peer")


def test_a_live_rank_is_not_called_gone():
    me = f"{socket.gethostname()}/{os.getpid()}/{position.process_state(os.getpid())[1]}"
    assert _in_gradient_sync_at_41(me, "RuntimeError: Connection reset by peer") == (
        "rank 0 stopped at step 41 in gradient sync: RuntimeError: Connection reset by peer; "
        "not there: rank 1 (waiting in gradient sync at step 36, 2 s ago)")


def test_a_rank_on_another_host_is_said_to_have_closed_its_connection_only():
    line = _in_gradient_sync_at_41("node-7/1234/99", "RuntimeError: Connection closed by peer "
                                   "[10.0.0.7]:25738")
    assert line == ("rank 0 stopped at step 41 in gradient sync: rank 1's connection closed (on "
                    "node-7; last seen waiting in gradient sync at step 36, 2 s ago); this rank "
                    "got RuntimeError: Connection closed by peer [10.0.0.7]:25738")
    # another error: nothing is known about rank 1 but where it was
    assert _in_gradient_sync_at_41("node-7/1234/99", "RuntimeError: Timed out") == (
        "rank 0 stopped at step 41 in gradient sync: RuntimeError: Timed out; not there: rank 1 "
        "(waiting in gradient sync at step 36, 2 s ago)")


def test_a_cause_quoting_the_rank_that_stopped_first_is_kept_as_it_is():
    proc, identity = _ended_process(reap=True)
    cause = "RuntimeError after another rank stopped first: rank 1: ValueError: bad"
    assert _in_gradient_sync_at_41(identity, cause, name_lost=False).startswith(
        f"rank 0 stopped at step 41 in gradient sync: {cause}; not there: rank 1 (")


def test_the_line_keeps_a_short_cause_of_gloos_text():
    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection "
            "closed by peer [127.0.0.1]:25738. This is typically caused by a remote worker "
            "crashing. Check the logs of the remote worker before reporting an error. GLHF!")
    assert stall.short_cause(RuntimeError(gloo)) == (
        "RuntimeError: Connection closed by peer [127.0.0.1]:25738")
    assert stall.short_cause(ValueError("bad.\nmore")) == "ValueError: bad."
    assert stall.short_cause(KeyError()) == "KeyError"
    assert stall.short_cause(RuntimeError("x" * 300)) == "RuntimeError: " + "x" * 117 + "..."


# ---------------------------------------------------------------- through torchrun
def _run_with_fault(tiny_fmnist, tmp_path, fault, extra=(), timeout_s=20):
    from tests.conftest import run_module, tiny_overrides
    run = tmp_path / "run"
    start = time.monotonic()
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        f"dist.timeout_s={timeout_s}", "dist.stall_warn_s=4", *extra], nproc=2,
        env={"DDP_LAB_FAULT": fault}, timeout=240)
    return run, proc, time.monotonic() - start


@pytest.mark.system
def test_a_hung_rank_is_named_and_every_rank_is_gone_within_the_timeout(tiny_fmnist, tmp_path):
    run, proc, seconds = _run_with_fault(tiny_fmnist, tmp_path, "rank=1,step=3,kind=hang", timeout_s=10)
    assert proc.returncode != 0
    assert "DDP_LAB_FAULT: rank 1 hangs after step 3" in proc.stderr
    rank0 = (run / "rank0.log").read_text()
    assert "rank 0 has waited" in rank0 and "in gradient sync at step 4 for rank 1 (in " \
        "logging at step 3" in rank0  # the warning at stall_warn_s
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error: rank 0 has")]
    assert len(errors) == 1 and "for rank 1 (in logging at step 3" in errors[0]
    assert "giving up at dist.timeout_s=10" in errors[0]
    # rank 1's own watchdog: its training thread made no progress outside a collective
    assert "ddp_lab: error: rank 1 has made no progress for 10 s in logging at step 3 (the " \
        "others: rank 0 (waiting in gradient sync at step 4" in proc.stderr
    assert sorted(p.name for p in (run / "stacks").iterdir()) == ["rank0.txt", "rank1.txt"]
    assert "in after_step" in (run / "stacks" / "rank1.txt").read_text()  # where it hung
    assert seconds < 10 + 60  # the timeout, plus start-up and torchrun's stop on a busy machine


STOPS = {  # where rank 1 is stopped: DDP_LAB_FAULT's step and phase, what rank 0 names (an evaluation's
    # phase and its collective: test_the_training_thread_marks_its_place)
    "steady state": ("step=3", "", "in gradient sync at step 4 for rank 1 (in logging at step 3"),
    "checkpoint write": ("step=8", ",phase=checkpoint step-8: writing",
                         "in checkpoint step-8: files written at step 8 for rank 1 (in "
                         "checkpoint step-8: writing rank1.pt at step 8"),
}


@pytest.mark.system
@pytest.mark.parametrize("where", STOPS)
def test_a_stopped_rank_is_named_with_its_phase_and_the_job_ends(tiny_fmnist, tmp_path, where):
    """SIGSTOP: rank 1 cannot answer at all, not even through its watchdog."""
    step, phase, named = STOPS[where]
    run, proc, seconds = _run_with_fault(
        tiny_fmnist, tmp_path, f"rank=1,{step},kind=stop{phase}",
        ["trainer.compile=false"], timeout_s=10)
    assert proc.returncode != 0
    assert "DDP_LAB_FAULT: rank 1 sends itself SIGSTOP" in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error: rank 0 has")]
    assert len(errors) == 1 and named in errors[0], proc.stderr[-3000:]
    # rank 0 kills the stopped rank (on its host): torchrun's SIGTERM would wait in it 30 s
    assert "giving up at dist.timeout_s=10; rank 1 was stopped (SIGSTOP) on this host: " \
        "killed it" in errors[0]
    assert seconds < 10 + 60  # start-up
    leftover = subprocess.run(["pgrep", "-f", f"hydra.run.dir={run}"], capture_output=True)
    assert leftover.stdout == b"", "a rank outlived the job"


@pytest.mark.system
def test_a_skipped_gradient_sync_is_named_as_a_desync(tiny_fmnist, tmp_path):
    run, proc, _ = _run_with_fault(tiny_fmnist, tmp_path, "rank=1,step=3,kind=mismatch")
    assert proc.returncode != 0
    assert "DDP_LAB_FAULT: rank 1 skips the gradient sync of step 3" in proc.stderr
    # rank 1's step-4 gradient sync pairs with rank 0's of step 3 (the same size); then
    # rank 1's straggler report (log_every=2) meets rank 0's step-4 gradient sync. Both wait
    # dist.timeout_s; whichever gives up first leaves, and the other may then fail on the
    # closed connection before its own watchdog looks: it says so, quoting the first.
    desync = "the ranks are out of step (a rank skipped or added a collective: a desync); giving up at " \
             "dist.timeout_s=20"
    lines = proc.stderr.splitlines()
    gave_up = {r for r in (0, 1) if any(ln.startswith(f"ddp_lab: error: rank {r} has waited 20 s") and
                                        desync in ln for ln in lines)}
    followed = {r for r in (0, 1) if any(ln.startswith(f"ddp_lab: rank {r} stopped at step 4 ") and
                                         "after another rank stopped first: rank" in ln and desync in ln
                                         for ln in lines)}
    assert gave_up and gave_up | followed == {0, 1}, proc.stderr[-3000:]
    assert any("rank 0 has waited 20 s in gradient sync at step 4 for rank 1 (waiting in straggler report "
               "at step 4" in ln or "rank 1 has waited 20 s in straggler report at step 4 for rank 0 (waiting "
               "in gradient sync at step 4" in ln for ln in lines), proc.stderr[-3000:]
    assert sorted(p.name for p in (run / "stacks").iterdir()) == [f"rank{r}.txt" for r in sorted(gave_up)]


@pytest.mark.system
def test_a_killed_rank_is_named_first_by_the_survivor(tiny_fmnist, tmp_path):
    run, proc, _ = _run_with_fault(tiny_fmnist, tmp_path, "rank=1,step=3,kind=kill")
    assert proc.returncode == 1 and "DDP_LAB_FAULT: rank 1 sends itself SIGKILL" in proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: rank 0 stopped")]
    assert len(said) == 1, proc.stderr[-3000:]
    assert said[0].split(": ", 2)[2].startswith("rank 1 is gone (its process ended; last seen "), said
    assert "GLHF" not in said[0] and "pair.cc" not in said[0]  # gloo's text: in the log only
    log = (run / "rank0.log").read_text()
    assert "GLHF" in log, (said, log[-3000:])  # all of it, with the traceback
