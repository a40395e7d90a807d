"""Stragglers: compute and sync wait per rank, the skew, and the run's straggler named."""
import gc
import time
import weakref

import pytest
import torch
from torch import nn

from ddp_lab.distributed import DistEnv
from ddp_lab.telemetry.stragglers import StepTimer, skew

ALONE = DistEnv(0, 1, 0, torch.device("cpu"), "none")


def test_skew_is_the_slowest_over_the_median_of_the_others():
    assert skew([10.0]) == (0, 1.0)
    assert skew([10.0, 20.0]) == (1, 2.0)
    assert skew([10.0, 10.0, 30.0, 12.0]) == (2, 3.0)
    assert skew([10.0, 20.0, 20.0]) == (1, 20.0 / 15.0)
    assert skew([10.0, 10.0, 10.0]) == (0, 1.0)


def test_no_step_timed_names_no_straggler():
    """A launch resumed at its last step times nothing: 0 over 0 is no ratio, and no straggler."""
    rank, ratio = skew([0.0, 0.0])
    assert rank == 0 and ratio != ratio  # NaN
    timer = StepTimer(nn.Linear(2, 2), ALONE)
    timer.gather = lambda totals: [(0.0, 0.0), (0.0, 0.0)]  # two ranks, no step each
    assert timer.straggler(1.2) is None


def test_compute_ends_when_the_last_gradient_is_ready():
    model = nn.Linear(8, 4)
    timer = StepTimer(model, ALONE)
    for _ in range(3):
        timer.start_step()
        time.sleep(0.02)  # "forward"
        model(torch.randn(2, 8)).sum().backward()
        time.sleep(0.01)  # "waiting for the sync"
        timer.synced()
    (compute, wait), = timer.gather(timer.run)
    assert 20 <= compute < 40 and 10 <= wait < 25
    report = timer.report()
    assert set(report) == {"perf/compute_ms/rank0", "perf/sync_wait_ms/rank0", "perf/straggler_skew"}
    assert report["perf/straggler_skew"] == 1.0
    assert timer.window.tolist() == [0.0, 0.0, 0.0]  # reported: the window starts again
    assert timer.straggler(1.2) is None  # alone, nobody is slower than the others


def test_a_timer_lets_its_model_go():
    """The timer held the last parameter whose gradient came in, and the parameter's hooks hold the timer: a cycle
    the collector never freed, which kept an fsdp run's mesh, and its group, alive past teardown."""
    def a_step():
        model = nn.Linear(4, 2)
        timer = StepTimer(model, ALONE)
        timer.start_step()
        model(torch.ones(1, 4)).sum().backward()
        timer.synced()
        return weakref.ref(model.weight), weakref.ref(timer)
    weight, timer = a_step()
    gc.collect()
    assert weight() is None and timer() is None


def test_on_cuda_after_the_first_step_only_the_last_gradient_records_an_event(monkeypatch):
    """Each event recorded costs the host CUDA runtime calls: one a step for the gradients, not one per
    parameter (the first step learns which comes last). CUDA's events stood in for by counting ones."""
    recorded = []

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            recorded.append(self)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))  # 4 parameters
    timer = StepTimer(model, ALONE)
    timer.cuda = True
    per_step = []
    for _ in range(3):
        before = len(recorded)
        timer.start_step()
        model(torch.randn(3, 4)).sum().backward()
        timer.synced()
        per_step.append(len(recorded) - before)
    assert per_step == [2 + 4 + 1, 2 + 1 + 1, 2 + 1 + 1]  # start and "ready at once", the gradients, synced
    assert timer._last in (id(model[0].weight), id(model[0].bias))  # the first layer's: the last reached


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_times_are_events_read_at_report_time():
    gpu = DistEnv(0, 1, 0, torch.device("cuda", 0), "none")
    model = nn.Linear(4096, 4096).cuda()
    timer = StepTimer(model, gpu)
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        timer.start_step()
        model(x).sum().backward()
        torch.cuda._sleep(10_000_000)  # device work after the gradients: "waiting for the sync"
        timer.synced()
    assert timer.run.tolist() == [0.0, 0.0, 0.0] and len(timer._unread) == 3  # nothing read yet
    report = timer.report()
    assert report["perf/compute_ms/rank0"] > 0 and report["perf/sync_wait_ms/rank0"] > 1
    assert timer.run[2].item() == 3 and not timer._unread


@pytest.mark.system
def test_a_slow_rank_is_named_in_the_summary_and_in_tensorboard(tiny_fmnist, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.conftest import read_summary, run_module, tiny_overrides
    run = tmp_path / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run), nproc=2,
                      env={"DDP_LAB_FAULT": "rank=1,step=1,kind=slow=3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    straggler = read_summary(run)["straggler"]
    assert straggler["rank"] == 1 and straggler["slowdown"] > 1.5, straggler
    assert "straggler: rank 1 computed" in (run / "rank0.log").read_text()
    events = EventAccumulator(str(run / "tb")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"perf/compute_ms/rank0", "perf/compute_ms/rank1", "perf/sync_wait_ms/rank0",
            "perf/sync_wait_ms/rank1", "perf/straggler_skew"} <= tags
    compute = {r: [e.value for e in events.Scalars(f"perf/compute_ms/rank{r}")] for r in (0, 1)}
    wait = {r: [e.value for e in events.Scalars(f"perf/sync_wait_ms/rank{r}")] for r in (0, 1)}
    # rank 1 computes longer; rank 0 waits for it at the sync
    assert sum(compute[1]) > 1.5 * sum(compute[0])
    assert sum(wait[0]) > sum(wait[1])
