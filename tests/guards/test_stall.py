"""The stall inspector's reports: who has not arrived, a desync, why a rank stopped."""
import time

import pytest

from ddp_lab.guards import stall


def _place(step, phase, inside, ago=0.0):
    return {"step": step, "phase": phase, "inside": inside, "time": time.time() - ago}


def test_a_waiting_rank_names_the_ranks_that_have_not_arrived():
    places = {0: _place(120, "gradient sync", True), 1: _place(119, "loss check", False, ago=75),
              2: _place(120, "gradient sync", True), 3: None}
    assert stall.missing(places[0], places) == [1, 3]
    assert stall.stall_report(0, 61.2, places) == (
        "rank 0 has waited 61 s in gradient sync at step 120 for rank 1 (last entered loss "
        "check at step 119, 75 s ago); rank 3 (never seen)")


def test_a_rank_in_another_collective_at_the_same_step_is_a_desync():
    places = {0: _place(5, "gradient sync", True), 1: _place(5, "loss check", True, ago=30)}
    assert stall.stall_report(0, 30, places) == (
        "rank 0 has waited 30 s in gradient sync at step 5 for rank 1 (waiting in loss check "
        "at step 5, 30 s ago): the ranks are out of step (a rank skipped or added a "
        "collective: a desync)")


def test_the_training_thread_marks_its_place():
    stall.at_step(7)
    with stall.collective("evaluation counts"):
        assert (stall.HERE.step, stall.HERE.phase, stall.HERE.inside) == (7, "evaluation counts", True)
        assert stall.why_stopped(2, "RuntimeError: Connection closed by peer", None) == (
            "rank 2 stopped at step 7 in evaluation counts: RuntimeError: Connection closed by peer")
    assert not stall.HERE.inside
    assert stall.why_stopped(0, "SIGTERM", None) == "rank 0 stopped at step 7 after evaluation counts: SIGTERM"


def test_stacks_are_written_per_rank(tmp_path):
    path = stall.dump_stacks(tmp_path, 3)
    assert path == tmp_path / "stacks" / "rank3.txt"
    assert "test_stacks_are_written_per_rank" in path.read_text()
    (tmp_path / "file").write_text("x")
    assert stall.dump_stacks(tmp_path / "file", 0) is None  # cannot: no crash either


class _Store:
    """A dict with the two store calls the inspector makes."""

    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)


def test_the_inspector_publishes_and_reads_places(monkeypatch, tmp_path):
    monkeypatch.setattr(stall, "PUBLISH_S", 0.05)
    store = _Store()
    store.set("place/1", '{"step": 3, "phase": "loss check", "inside": false, "time": 0}')
    inspector = stall.StallInspector(store, 0, 2, tmp_path, warn_s=60, timeout_s=120).start()
    try:
        stall.at_step(4)
        with stall.collective("gradient sync"):
            deadline = time.monotonic() + 5
            while b'"step": 4' not in store.data.get("place/0", b"") and time.monotonic() < deadline:
                time.sleep(0.02)
            places = inspector.places()
    finally:
        inspector.close()
    assert places[0]["step"] == 4 and places[0]["phase"] == "gradient sync"
    assert places[1] == {"step": 3, "phase": "loss check", "inside": False, "time": 0}
    assert stall.missing(places[0], places) == [1]


@pytest.fixture(autouse=True)
def _fresh_place(monkeypatch):
    monkeypatch.setattr(stall, "HERE", stall.Place())


# ---------------------------------------------------------------- through torchrun
def _run_with_fault(tiny_fmnist, tmp_path, fault, extra=()):
    from tests.conftest import run_module, tiny_overrides
    run = tmp_path / "run"
    start = time.monotonic()
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        "dist.timeout_s=20", "dist.stall_warn_s=4", *extra], nproc=2,
        env={"DDP_LAB_FAULT": fault}, timeout=240)
    return run, proc, time.monotonic() - start


@pytest.mark.system
def test_a_hung_rank_is_named_and_every_rank_is_gone_within_the_timeout(tiny_fmnist, tmp_path):
    run, proc, seconds = _run_with_fault(tiny_fmnist, tmp_path, "rank=1,step=3,kind=hang")
    assert proc.returncode != 0
    assert "DDP_LAB_FAULT: rank 1 hangs after step 3" in proc.stderr
    rank0 = (run / "rank0.log").read_text()
    assert "rank 0 has waited" in rank0 and "in gradient sync at step 4 for rank 1 (last " \
        "entered gradient sync at step 3" in rank0  # the warning at stall_warn_s
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error: rank 0 has")]
    assert len(errors) == 1 and "for rank 1 (last entered gradient sync at step 3" in errors[0]
    assert "giving up at dist.timeout_s=20" in errors[0]
    assert "ddp_lab: rank 1 stopped at step 3 after gradient sync: SIGTERM" in proc.stderr
    assert sorted(p.name for p in (run / "stacks").iterdir()) == ["rank0.txt", "rank1.txt"]
    assert "in after_step" in (run / "stacks" / "rank1.txt").read_text()  # where it hung
    assert seconds < 20 + 60  # the timeout, plus start-up and torchrun's stop on a busy machine


@pytest.mark.system
def test_a_skipped_gradient_sync_is_named_as_a_desync(tiny_fmnist, tmp_path):
    run, proc, _ = _run_with_fault(tiny_fmnist, tmp_path, "rank=1,step=3,kind=mismatch")
    assert proc.returncode != 0
    assert "DDP_LAB_FAULT: rank 1 skips the gradient sync of step 3" in proc.stderr
    # rank 1's step-4 gradient sync pairs with rank 0's of step 3 (the same size); then
    # rank 1's straggler report (log_every=2) meets rank 0's step-4 gradient sync
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error: rank ")]
    assert len(errors) == 2, proc.stderr[-3000:]
    assert all("the ranks are out of step (a rank skipped or added a collective: a desync); "
               "giving up at dist.timeout_s=20" in ln for ln in errors)
    assert any(ln.startswith("ddp_lab: error: rank 0 has waited 20 s in gradient sync at step 4 "
                             "for rank 1 (waiting in straggler report at step 4") for ln in errors)
    assert sorted(p.name for p in (run / "stacks").iterdir()) == ["rank0.txt", "rank1.txt"]
