"""Machine tuning (ddp_lab/tuning/__init__.py): the rule that decides dist.comm_threads and
sync.poll, how it is applied to gloo's threads, and what the rest of the code is handed."""
import os
import threading
from types import SimpleNamespace

import pytest
import torch

from ddp_lab import collectives, tuning
from ddp_lab.collectives import TunedPlan
from ddp_lab.config import ConfigError
from ddp_lab.distributed import RANKS_ON_MACHINE_ENV, DistEnv
from ddp_lab.tuning import gloo_threads
from tests.conftest import linux_only, may_use_realtime, needs_realtime
from tests.multiproc import run_in_processes

CPU = torch.device("cpu")


@pytest.mark.parametrize("comm_threads, poll, backend, device, ranks, cores, threads_got, polls, why", [
    # auto: on where the ranks fill every core, off where cores are to spare
    ("auto", "auto", "gloo", "cpu", 2, 2, "realtime", True, "2 ranks on this machine fill the 2 cores"),
    ("auto", "auto", "gloo", "cpu", 3, 2, "realtime", False, "3 ranks on this machine fill the 2 cores"),  # no spinning
    ("auto", "auto", "gloo", "cpu", 8, 2, "realtime", False, "8 ranks on this machine fill the 2 cores"),
    ("auto", "auto", "gloo", "cpu", 2, 64, "normal", False, "2 ranks on this machine leave 62 of 64 cores free"),
    # asked for: whatever the cores
    ("realtime", "false", "gloo", "cpu", 2, 64, "realtime", False, "dist.comm_threads=realtime sync.poll=false"),
    ("normal", "true", "gloo", "cpu", 4, 2, "normal", True, "4 ranks on this machine fill"),
    ("auto", True, "gloo", "cpu", 1, 64, "normal", True, "sync.poll=true"),    # YAML's true is a bool
    ("auto", "False", "gloo", "cpu", 2, 2, "realtime", False, "sync.poll=false"),  # as OmegaConf passes it
    # nothing to tune off gloo on CPU: CUDA ranks wait on the GPU, not on a busy CPU
    ("auto", "auto", "nccl", "cuda", 8, 8, "normal", False, "nccl on cuda: nothing to tune"),
    ("auto", "true", "gloo", "cuda", 2, 2, "normal", False, "gloo on cuda: nothing to tune"),
])
def test_the_decision_rule(comm_threads, poll, backend, device, ranks, cores, threads_got, polls, why):
    got = tuning.decide(comm_threads, poll, backend=backend, device_type=device, machine_ranks=ranks, cores=cores)
    assert (got.comm_threads, got.poll) == (threads_got, polls)
    assert why in got.why


@pytest.mark.parametrize("comm_threads, poll, backend, message", [
    ("auto", "sometimes", "gloo", "sync.poll='sometimes' is not one of auto, true, false"),
    ("realtime", "auto", "nccl", "dist.comm_threads=realtime schedules gloo's threads, but this run uses nccl"),
])
def test_bad_values_name_the_choices(comm_threads, poll, backend, message):
    with pytest.raises(ConfigError, match=message):
        tuning.decide(comm_threads, poll, backend=backend, device_type="cpu", machine_ranks=2, cores=2)


def test_start_checks_before_joining_and_tunes_nothing_alone(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    cfg = SimpleNamespace(backend="auto", device="cpu", timeout_s=60, comm_threads="realtime")
    with pytest.raises(ConfigError, match="sync.poll='sometimes'"):
        tuning.start(cfg, poll="sometimes")
    env = tuning.start(cfg, poll="true")  # one process: no group, no gloo threads
    assert (env.backend, env.comm_threads, env.poll) == ("none", "normal", False)


def test_tuning_is_asked_for_only_by_a_setting_off_its_default():
    cfg = SimpleNamespace(comm_threads="normal")
    assert not tuning.asked(cfg, False) and not tuning.asked(cfg, "false")
    assert tuning.asked(cfg, True) and tuning.asked(cfg, "auto")
    assert tuning.asked(SimpleNamespace(comm_threads="auto"), False)
    with pytest.raises(ConfigError, match="sync.poll='sometimes'"):
        tuning.asked(cfg, "sometimes")


def test_ranks_on_machine_counts_every_emulated_host(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv(RANKS_ON_MACHINE_ENV, raising=False)
    assert tuning.ranks_on_machine(world_size=8) == 2  # torchrun's own count: other hosts have their own cores
    monkeypatch.setenv(RANKS_ON_MACHINE_ENV, "8")  # ddp_lab.tools.cluster: 4 hosts x 2 on these cores
    assert tuning.ranks_on_machine(world_size=8) == 8
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv(RANKS_ON_MACHINE_ENV)
    assert tuning.ranks_on_machine(world_size=3) == 3  # not under torchrun: every rank is here


def test_usable_cores_is_the_affinity_mask():
    assert tuning.usable_cores() == len(os.sched_getaffinity(0))


WANT_REALTIME = tuning.Decision("realtime", False, "3 ranks on this machine fill the 2 cores")


@linux_only
def test_without_permission_auto_warns_and_realtime_fails(threads, monkeypatch):
    loop = threads("gloo_tcp_loop")
    loop.named.wait()

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    got, why, refused = tuning.apply(WANT_REALTIME, "auto", {loop.tid})
    assert (got, refused) == ("normal", True)
    assert "could not give gloo's threads real-time priority" in why
    assert "dist.comm_threads=normal silences this" in why
    with pytest.raises(ConfigError, match=r"CAP_SYS_NICE \(docker run --cap-add=SYS_NICE\)"):
        tuning.apply(WANT_REALTIME, "realtime", {loop.tid})


@linux_only
def test_no_gloo_thread_found_is_reported(threads):
    other = threads("writer")
    other.named.wait()
    with pytest.raises(ConfigError, match="found no gloo threads"):
        tuning.apply(WANT_REALTIME, "realtime", {other.tid})


@linux_only
def test_normal_leaves_the_threads_alone(threads):
    loop = threads("gloo_tcp_loop")
    loop.named.wait()
    assert tuning.apply(WANT_REALTIME._replace(comm_threads="normal"), "auto", {loop.tid})[:2] == (
        "normal", WANT_REALTIME.why)
    assert os.sched_getscheduler(loop.tid) == os.SCHED_OTHER


@linux_only
@needs_realtime
def test_a_sweeps_next_job_reports_what_the_threads_have(threads):
    loop = threads("gloo_tcp_loop")
    loop.named.wait()
    assert tuning.apply(WANT_REALTIME, "auto", {loop.tid})[0] == "realtime"
    # The next job of a sweep: no new threads; what it asks for changes nothing.
    got, why, _ = tuning.apply(WANT_REALTIME._replace(comm_threads="normal"), "normal", None)
    assert got == "realtime" and "as the first job of this sweep left them" in why
    os.sched_setscheduler(loop.tid, os.SCHED_OTHER, os.sched_param(0))
    assert tuning.apply(WANT_REALTIME, "auto", None)[0] == "normal"


def test_allreduce_hands_each_algorithm_what_this_rank_decided():
    def env(comm_threads="normal", poll=False):
        return DistEnv(0, 2, 0, CPU, "gloo", comm_threads=comm_threads, poll=poll)

    assert tuning.allreduce("builtin", env(poll=True)) is tuning.polling_allreduce
    assert tuning.allreduce("builtin", env("realtime")) is collectives.builtin_allreduce
    assert tuning.allreduce("ring", env()).keywords == {"plan": TunedPlan(realtime_threads=False)}
    assert tuning.allreduce("ring_textbook", env(poll=True)) is collectives.ring_textbook_allreduce
    # real-time threads: the plan says so, and each call runs at their priority
    fast = tuning.allreduce("halving_doubling", env("realtime"))
    assert fast.__wrapped__.keywords == {"plan": TunedPlan(realtime_threads=True)}
    assert tuning.allreduce("ring_textbook", env("realtime")).__wrapped__ is collectives.ring_textbook_allreduce
    assert tuning.plan_for(env("realtime")) == TunedPlan(realtime_threads=True)


def _tune_and_reduce(rank, world_size, wanted):
    me = threading.get_native_id()
    # The harness has already built the group: every other thread is its.
    got, _, refused = tuning.apply(wanted, "auto", gloo_threads.thread_ids() - {me})
    env = DistEnv(rank, world_size, 0, CPU, "gloo", comm_threads=got)
    sums = {}
    for name in collectives.ALGORITHMS:  # each as this rank runs it, at its threads' priority
        t = torch.full((1 << 18,), float(rank + 1))
        tuning.allreduce(name, env)(t)
        sums[name] = t[0].item()
    policies = sorted((gloo_threads.thread_name(tid), os.sched_getscheduler(tid))
                      for tid in gloo_threads.thread_ids() if tid != me)
    return got, refused, policies, os.sched_getscheduler(me), sums


@linux_only
def test_a_real_group_gets_realtime_gloo_threads_where_permitted():
    permitted = may_use_realtime()
    for want in ("realtime", "normal"):
        wanted = tuning.Decision(want, False, "test")
        for got, refused, policies, main_policy, sums in run_in_processes(_tune_and_reduce, 2, wanted):
            assert set(sums.values()) == {3.0}  # every algorithm still sums right
            assert main_policy == os.SCHED_OTHER  # the calling thread is given back its priority
            names = [name for name, _ in policies]
            assert "gloo_tcp_loop" in names and "pt_gloo_runloop" in names
            fifo = want == "realtime" and permitted
            assert (got, refused) == ("realtime" if fifo else "normal", want == "realtime" and not permitted)
            expected = os.SCHED_FIFO if fifo else os.SCHED_OTHER
            assert all(policy == expected for _, policy in policies), policies


def _agree(rank, world_size, wanted_by_rank):
    me = threading.get_native_id()
    wanted = tuning.Decision(wanted_by_rank[rank], False, "test")
    got, _, _ = tuning.apply(wanted, "auto", gloo_threads.thread_ids() - {me})
    threads, why, overruled = tuning.agree_across_ranks(got, "test")
    gloo = gloo_threads.gloo_threads(gloo_threads.thread_ids(), 0)
    return got, threads, overruled, why, {os.sched_getscheduler(t) for t in gloo}


@linux_only
@needs_realtime
def test_real_time_threads_on_every_rank_or_on_none():
    # rank 1 at normal priority (as where it was refused): rank 0 gives its threads back
    (got0, threads0, overruled0, why0, policies0), (_, threads1, overruled1, _, policies1) = run_in_processes(
        _agree, 2, ("realtime", "normal"))
    assert got0 == "realtime" and (threads0, overruled0) == ("normal", True)
    assert "another rank's are at normal priority" in why0
    assert (threads1, overruled1) == ("normal", False)
    assert policies0 == policies1 == {os.SCHED_OTHER}
    for got, threads, overruled, _, policies in run_in_processes(_agree, 2, ("realtime", "realtime")):
        assert (got, threads, overruled, policies) == ("realtime", "realtime", False, {os.SCHED_FIFO})


def test_the_plan_says_whether_the_ranks_span_hosts(monkeypatch):
    env = DistEnv(rank=0, world_size=4, local_rank=0, device=torch.device("cpu"), backend="gloo")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: 2 of the 4 ranks on this node
    assert tuning.plan_for(env).across_hosts is True
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert tuning.plan_for(env).across_hosts is False
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # not under torchrun: one host
    assert tuning.plan_for(env) == TunedPlan()
