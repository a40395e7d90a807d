"""torchrun across emulated hosts: the same training as on loopback, restarts, signals, failures."""
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from ddp_lab.tools.cluster import running
from ddp_lab.tools.cluster.commands import ip
from ddp_lab.tools.cluster.network import set_link
from tests.conftest import read_summary, run_module, tiny_overrides

pytestmark = pytest.mark.system
SAME = ["trainer.amp=off"]
CKPT = ["trainer.ckpt_every_steps=3", "trainer.keep_ckpts=10", "dist.timeout_s=60"]
# Every worker says it is ready once its process group is up, then waits (or fails on rank 1).
WAIT_OR_FAIL = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print("ready", flush=True)
    if sys.argv[1] == "fail" and dist.get_rank() == 1:
        sys.exit(3)
    dist.barrier()
    time.sleep(600)
""")


# Workers all-reduce until a peer is lost; the process group gives up after 10 s.
ALLREDUCE_FOREVER = textwrap.dedent("""
    import datetime
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    x = torch.ones(1000)
    dist.all_reduce(x)
    print("ready", flush=True)
    while True:
        dist.all_reduce(x)
""")
TIMEOUT_S = 10


def same_weights(a, b) -> None:
    wa, wb = torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.fixture(scope="module")
def loopback_run(tiny_fmnist, tmp_path_factory):
    """The reference: `torchrun --standalone --nproc_per_node=2` on loopback."""
    run_dir = tmp_path_factory.mktemp("loopback") / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run_dir) + SAME, nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_two_hosts_train_the_same_model_as_loopback(two_hosts, loopback_run, tiny_fmnist, tmp_path):
    # no hydra.run.dir: the run directory is named by the one rendezvous id of all agents
    overrides = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "x") if not o.startswith("hydra.")]
    with running(two_hosts, ["-m", "ddp_lab.train", *overrides, *SAME], run_id="same-as-loopback",
                 cwd=tmp_path, out=None, err=None) as job:
        rc = job.wait(timeout=240)
    assert rc == 0, job.output()[-3000:]
    assert "OMP_NUM_THREADS" not in job.extra_env
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["same-as-loopback"]
    run_dir = tmp_path / "outputs" / "same-as-loopback"
    same_weights(loopback_run, run_dir)
    s = read_summary(run_dir)
    loopback = read_summary(loopback_run)
    assert (s["world_size"], s["threads"], s["test_correct"]) == (2, 1, loopback["test_correct"])
    # 2 hosts x 1 rank share the cores as 2 local ranks do: the same machine tuning
    assert s["comm_threads"] == loopback["comm_threads"]


def test_a_killed_host_restarts_and_ends_bit_identical(two_hosts, loopback_run, tiny_fmnist, tmp_path):
    run_dir = tmp_path / "run"
    command = ["-m", "ddp_lab.train", *tiny_overrides(tiny_fmnist, run_dir), *SAME, *CKPT]
    with running(two_hosts, command, max_restarts=1, out=None, err=None) as job:
        deadline = time.monotonic() + 120
        while not list(run_dir.glob("checkpoints/step-*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = job.worker_pids(1)
        assert killed, job.output()[-3000:]
        for pid in killed:  # every worker of host 1, mid-run
            subprocess.run(["kill", "-9", str(pid)])
        rc = job.wait(timeout=240)
    out = job.output()
    assert rc == 0, out[-3000:]
    assert "resumed from" in out, out[-3000:]  # the restarted workers went on from a checkpoint
    same_weights(loopback_run, run_dir)
    assert read_summary(run_dir)["steps"] == 16


def test_sigint_reaches_every_agent_and_nothing_is_left(two_hosts, tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(WAIT_OR_FAIL)
    proc = subprocess.Popen([sys.executable, "-m", "ddp_lab.tools.cluster", "run", "--name", two_hosts.name,
                             "--", str(script), "wait"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        ready = 0
        while ready < 2:  # both hosts' workers are in the process group
            line = proc.stdout.readline()
            assert line, "the job ended before its workers were ready"
            ready += line.endswith("] ready\n")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    for host in two_hosts.hosts:
        assert ip("netns", "pids", host.netns).split() == [], f"processes left in {host.name}"


def test_a_failing_host_fails_the_job(two_hosts, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(WAIT_OR_FAIL)
    with running(two_hosts, [str(script), "fail"], out=None, err=None) as job:
        rc = job.wait(timeout=120)
    assert rc != 0
    assert "exitcode  : 3" in job.output(1), job.output()[-3000:]
    for host in two_hosts.hosts:
        assert ip("netns", "pids", host.netns).split() == []


def test_a_host_whose_link_goes_down_ends_the_job(two_hosts, tmp_path):
    script = tmp_path / "forever.py"
    script.write_text(ALLREDUCE_FOREVER)
    lost = two_hosts.hosts[1]
    try:
        with running(two_hosts, [str(script)], out=None, err=None) as job:
            while job.output().count("] ready\n") < 2 and None in job.poll():
                time.sleep(0.05)
            set_link(two_hosts, lost.name, up=False)
            pulled = time.monotonic()
            rc = job.wait(timeout=120)
            ended = time.monotonic() - pulled
    finally:
        set_link(two_hosts, lost.name, up=True)
    err = job.output()
    assert rc != 0
    # every rank gives up after the process group's timeout; the cut-off host's agent, which
    # cannot reach the rendezvous on host 0, is stopped a few seconds after its workers end
    assert ended < TIMEOUT_S + 30, f"{ended:.1f} s"
    assert err.count("Timed out waiting") >= 2, err[-3000:]
    assert f"the link of {lost.name} is down" in err
    for host in two_hosts.hosts:
        assert ip("netns", "pids", host.netns).split() == []
    print(f"job ended {ended:.1f} s after the link went down")


def test_a_users_project_trains_across_two_hosts(two_hosts, tmp_path, monkeypatch):
    """examples/spirals (its own model, a DataLoader dataset) on two emulated hosts."""
    example = Path(__file__).parents[3] / "examples" / "spirals"
    monkeypatch.setenv("PYTHONPATH", str(example))  # every host's agent inherits it
    run_dir = tmp_path / "run"
    command = ["-m", "ddp_lab.train", "--config-dir", str(example / "conf"), "model=mlp", "data=spirals",
               "optim=adam", "trainer.epochs=2", "trainer.progress=false", f"hydra.run.dir={run_dir}"]
    with running(two_hosts, command, out=None, err=None) as job:
        rc = job.wait(timeout=240)
    assert rc == 0, job.output()[-3000:]
    s = read_summary(run_dir)
    assert (s["model"], s["world_size"], s["test_total"]) == ("mlp", 2, 2048)
    assert s["test_acc"] > 0.6  # three arms: chance is 1/3
