"""ddp_lab.telemetry.meter: the steps images/s is measured over, and the peak a run's MFU is measured against."""
import math

import torch

from ddp_lab.distributed import RANKS_ON_MACHINE_ENV, DistEnv
from ddp_lab.telemetry import meter, mfu
from ddp_lab.training.tasks import CLASSIFICATION


def threads_asked_and_peak(monkeypatch, world_size: int, env_vars: dict) -> tuple[list, float]:
    """What flops_and_peak asks peak_flops for (threads), and the peak it returns, on 2 cores
    whose one-thread peak is 10 and two-thread peak 20."""
    asked = []
    monkeypatch.setattr(mfu, "peak_flops", lambda device, dtype, threads=None, **kw: asked.append(threads)
                        or 10.0 * threads)
    monkeypatch.setattr(mfu.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv(RANKS_ON_MACHINE_ENV, raising=False)
    for k, v in env_vars.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    env = DistEnv(rank=0, world_size=world_size, local_rank=0, device=torch.device("cpu"), backend="gloo")
    _, peak = meter.flops_and_peak(torch.nn.Linear(4, 2), torch.zeros(4), "none", env)
    return asked, peak


def test_emulated_hosts_share_one_machines_peak(monkeypatch):
    # 4 emulated hosts x 1 rank on 2 cores: one machine of 2 cores, not 4 machines of one.
    asked, peak = threads_asked_and_peak(monkeypatch, 4, {"LOCAL_WORLD_SIZE": "1", RANKS_ON_MACHINE_ENV: "4"})
    assert (asked, peak) == ([2], 20.0)


def test_real_hosts_each_add_their_cores(monkeypatch):
    # 4 machines x 1 rank, no emulation: each rank's one thread on its own machine.
    asked, peak = threads_asked_and_peak(monkeypatch, 4, {"LOCAL_WORLD_SIZE": "1"})
    assert (asked, peak) == ([1], 40.0)
    # 2 machines x 2 ranks: 2 threads a machine, 2 machines.
    asked, peak = threads_asked_and_peak(monkeypatch, 4, {"LOCAL_WORLD_SIZE": "2"})
    assert (asked, peak) == ([2], 40.0)


def test_short_steps_stay_out_of_the_window(monkeypatch):
    """A partial last batch (torch.compile compiles its shape anew) is kept out of images/s,
    as warm-up is; whole steps on either side of it count."""
    env = DistEnv(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    m = meter.Meter(env, warmup_steps=1, full_step_images=4, task=CLASSIFICATION)
    # The clock is read where the window opens or closes: warm-up ends at 1 s, the short
    # step runs from 2 s to 12 s, the last whole step ends at 13 s.
    clock = iter([1.0, 2.0, 12.0, 13.0])
    monkeypatch.setattr(m.clock, "now", lambda: next(clock))
    measuring = []
    for images in [4, 4, 3, 4]:  # warm-up, whole, short, whole
        m.start_step(images)
        measuring.append(m.measuring)
        m.step_done(images)
    m.throughput.pause()
    tp = m.throughput
    assert measuring == [False, True, False, True]
    assert (tp.seen, tp.steps, tp.images) == (4, 2, 16)  # 2 whole steps x 4 images x 2 ranks
    assert tp.seconds == 2.0 and tp.per_sec == 8.0  # the short step's 10 s left out


def test_a_run_that_is_all_warm_up_measures_no_rate(monkeypatch):
    """The window opens as the last warm-up step ends; with no step after it, images/s and
    MFU are unknown (NaN, null in summary.json), not 0."""
    # two ranks' images, but no process group: the epoch's sums are not all-reduced
    env = DistEnv(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="none")
    m = meter.Meter(env, warmup_steps=2, flops_per_image=1e6, peak_flops=1e9, full_step_images=4, task=CLASSIFICATION)
    clock = iter([0.0, 1.0, 3.0, 3.0])  # epoch start, window opens (after step 2), closes, epoch end
    monkeypatch.setattr(m.clock, "now", lambda: next(clock))
    m.start_epoch()
    for _ in range(2):
        m.start_step(4)
        m.step_done(4)

    class NoSync:
        wire_bytes = collectives = 0

        def comm_figures(self, steps, seconds):
            return float("nan"), float("nan")

    metrics = m.end_epoch(0.1, NoSync())
    tp = m.throughput
    assert (tp.seen, tp.steps, tp.images, tp.seconds) == (2, 0, 0, 2.0)
    assert math.isnan(tp.per_sec) and math.isnan(tp.step_ms)
    assert math.isnan(metrics["perf/samples_per_sec"]) and math.isnan(metrics["perf/mfu"])
    assert math.isnan(m.mfu(tp.per_sec))
    assert metrics["perf/epoch_s"] == 3.0
