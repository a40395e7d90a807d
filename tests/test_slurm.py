"""scripts/slurm_train.sbatch on a real SLURM, made on this machine by scripts/slurm_local.sh.

The module's cluster (two emulated hosts, one slurmd each) has a name no user
would pick, a controller port of its own and no /etc/slurm/slurm.conf link
(--private), so it never meets a cluster someone brought up by hand. Skipped,
with the reason, where SLURM cannot be had: not root, no network namespaces,
or the packages are missing and apt-get cannot install them (set
DDP_LAB_TEST_SLURM=0 to skip it on purpose). Its teardown cancels the jobs and
takes the cluster down also when a test fails.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.conftest import free_port, read_summary

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "scripts" / "slurm_local.sh"
SBATCH = REPO / "scripts" / "slurm_train.sbatch"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "PREEMPTED"}
# Small and quick: 512 images a step on 2 ranks of 1 thread, no compile.
QUICK = ["data=synthetic", "data.num_test=256", "trainer.epochs=1", "trainer.progress=false",
         "trainer.warmup_steps=1", "trainer.compile=false"]
# Steps of at least 0.2 s (DDP_LAB_FAULT pace), on every attempt (each is a new launch): a run that must
# outlast a requeue or a warning lasts as long on a fast machine as on a slow one.
PACED = {"DDP_LAB_FAULT": "rank=0,step=1,kind=pace=0.2"}


@dataclass
class Slurm:
    name: str
    env: dict

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self.env, cwd=cwd, timeout=60)

    def submit(self, workdir: Path, overrides: list[str], options: tuple[str, ...] = (),
               **env: str) -> str:
        """sbatch [options] the script [Hydra overrides], from workdir; returns the job id."""
        proc = subprocess.run(["sbatch", "--parsable", *options, str(SBATCH), *overrides],
                              capture_output=True, text=True, cwd=workdir, env={**self.env, **env},
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """scontrol's fields of the job (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait(self, job_id: str, log: Path, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job.get("JobState") in ENDED:
                return job
            time.sleep(0.5)
        pytest.fail(f"job {job_id} did not end within {timeout:g} s; its log:\n{tail(log)}")


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text()[-chars:] if log.exists() else f"({log} does not exist)"


def skip_unless_slurm_can_run() -> None:
    if os.environ.get("DDP_LAB_TEST_SLURM") == "0":
        pytest.skip("DDP_LAB_TEST_SLURM=0")
    if os.geteuid() != 0:
        pytest.skip("SLURM's daemons and network namespaces need root")
    from ddp_lab.tools.cluster import ClusterError
    from ddp_lab.tools.cluster.commands import require_privileges, require_tools
    try:
        require_tools()
        require_privileges()
    except ClusterError as e:
        pytest.skip(f"cannot make network namespaces here: {e}")
    install = subprocess.run(["bash", str(LOCAL), "install"], capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        pytest.skip(f"SLURM cannot be installed here: {install.stderr.strip()}")


@pytest.fixture(scope="module")
def slurm():
    skip_unless_slurm_can_run()
    name = f"pt{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(key, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # our torchrun
    env["SLURM_CONF"] = f"/run/ddp_lab-slurm/{name}/slurm.conf"
    try:
        up = subprocess.run(["bash", str(LOCAL), "up", "--name", name, "--hosts", "2", "--port",
                             str(free_port()), "--private"], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        yield Slurm(name, env)
    finally:
        down = subprocess.run(["bash", str(LOCAL), "down", "--name", name], capture_output=True,
                              text=True, timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert not Path(f"/run/ddp_lab-slurm/{name}").exists()


@pytest.fixture
def cancel_on_failure(slurm):
    """submitted.append(job_id): cancelled after the test, whatever its outcome."""
    submitted: list[str] = []
    yield submitted
    for job_id in submitted:
        slurm.run("scancel", job_id)


def owners(run_dir: Path) -> list[list[str]]:
    launches = json.loads((run_dir / "launches.json").read_text())["launches"]
    return [launch["owners"] for launch in launches]


def test_sbatch_trains_on_two_nodes_in_one_run_dir(slurm, tmp_path, cancel_on_failure):
    job_id = slurm.submit(tmp_path, [*QUICK, "data.num_train=2048"], NPROC_PER_NODE="2")
    cancel_on_failure.append(job_id)
    log = tmp_path / f"slurm-{job_id}.out"
    job = slurm.wait(job_id, log)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), tail(log)

    assert f"job {job_id} (restart 0): 2 nodes x 2 ranks, 1 threads each" in log.read_text()
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == [job_id]  # one run dir
    run_dir = tmp_path / "outputs" / job_id
    s = read_summary(run_dir)
    assert (s["world_size"], s["steps"], s["backend"]) == (4, 4, "gloo")  # 2 nodes x 2 ranks; 2048/512
    assert sorted(p.name for p in run_dir.glob("rank*.log")) == [f"rank{r}.log" for r in range(4)]
    # one launch: this job, with one torchrun agent on each node
    [launch] = owners(run_dir)
    assert f"slurm:{job_id}" in launch
    assert sorted(o.split("/")[0] for o in launch if o.startswith("agent:")) == \
        [f"agent:{slurm.name}-0", f"agent:{slurm.name}-1"]


def test_requeue_resumes_from_the_newest_checkpoint(slurm, tmp_path, cancel_on_failure):
    job_id = slurm.submit(tmp_path, [*QUICK, "data.num_train=60000", "trainer.max_steps=40",
                                     "trainer.ckpt_every_steps=10"], **PACED)  # 30 steps, 6 s to requeue
    cancel_on_failure.append(job_id)
    log = tmp_path / f"slurm-{job_id}.out"
    first_ckpt = tmp_path / "outputs" / job_id / "checkpoints" / "step-10"
    deadline = time.monotonic() + 180
    while not first_ckpt.is_dir():
        state = slurm.job(job_id).get("JobState")
        assert state not in ENDED and time.monotonic() < deadline, \
            f"no checkpoint step-10 (job {state}); its log:\n{tail(log)}"
        time.sleep(0.1)
    requeue = slurm.run("scontrol", "requeue", job_id)
    assert requeue.returncode == 0, requeue.stderr

    job = slurm.wait(job_id, log)
    text = log.read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), tail(log)
    assert "CANCELLED AT" in text and "DUE TO JOB REQUEUE" in text  # the first attempt was stopped
    assert f"job {job_id} (restart 1)" in text
    run_dir = tmp_path / "outputs" / job_id
    resumed = re.findall(r"resumed from (\S+)/checkpoints/step-(\d+) \(step (\d+)", text)
    assert len(resumed) == 1 and resumed[0][0] == str(run_dir), text[-3000:]
    step = int(resumed[0][1])
    assert resumed[0][1] == resumed[0][2] and 10 <= step < 40
    # the newest checkpoint at the requeue: a periodic one (ckpt_every_steps), or the ranks' own save
    # on SLURM's SIGTERM, made only where the rank read SLURM's and its agent's as one
    assert step % 10 == 0 or f"saved checkpoint step-{step}" in text, text[-3000:]
    assert read_summary(run_dir)["steps"] == 40  # trainer.max_steps, counted across both attempts
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == [job_id]
    # both attempts belong to one launch (the same SLURM job): two agents each
    [launch] = owners(run_dir)
    assert f"slurm:{job_id}" in launch and sum(o.startswith("agent:") for o in launch) == 4


# 320 steps on 2 nodes x 1 rank, each paced to at least 0.2 s (DDP_LAB_FAULT pace): 64 s of training
# on any machine (unpaced, 8 epochs of 40960 took 109 s on a 2-core Zen 1 and 38 s on CI's runner,
# which ended before the warning came), and 10 s of start-up: more than a time limit of one minute,
# the shortest SLURM has (--time counts whole minutes), and longer than the latest warning (50 s, below).
LONGER_THAN_A_MINUTE = [*(o for o in QUICK if not o.startswith("trainer.epochs=")), "trainer.epochs=8",
                        "trainer.amp=off", "data.num_train=20480", "trainer.preempt_save_s=5"]


def test_the_time_limit_warning_saves_requeues_and_the_job_ends(slurm, tmp_path, cancel_on_failure):
    """--time=1 and the warning 10 s before it (a save takes under 1 s here, bounded by
    trainer.preempt_save_s=5). slurmctld sends the warning at its first look (every 30 s) that
    finds the limit within 10 + 30 s, i.e. 20-50 s into an attempt, and a requeued job starts
    again some 10 s later (slurm_local.sh: cred_expire): each attempt trains 10-40 s, so the job
    takes 2-8 attempts. That a save on SIGTERM resumes bit-identical is test_resume.py's (an
    uninterrupted reference here cost the suite 85 s)."""
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir()
    job_id = slurm.submit(cut_dir, LONGER_THAN_A_MINUTE, ("--time=1", "--signal=B:USR1@10"), **PACED)
    cancel_on_failure.append(job_id)

    log = cut_dir / f"slurm-{job_id}.out"
    states, deadline = [], time.monotonic() + 480  # (seconds, JobState, Restarts) at each change
    while time.monotonic() < deadline:
        job = slurm.job(job_id)
        now = (job.get("JobState"), job.get("Restarts"))
        if not states or states[-1][1:] != now:
            states.append((time.monotonic(), *now))
        if now[0] in ENDED:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"job {job_id} did not end within 480 s; its log:\n{tail(log)}")
    text = log.read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), tail(log)
    restarts = int(job["Restarts"])
    assert restarts >= 1, "the training ended before the time limit's warning\n" + tail(log)

    # each attempt but the last: the warning, every rank's save, the requeue; the next resumes there.
    # The last may be warned too, when the warning comes as its training ends: then not requeued.
    late = re.findall(rf"job {job_id}: the step ended \(\d+\) at .* after the training had ended", text)
    assert len(late) <= 1, tail(log)
    assert len(re.findall(rf"job {job_id}: SIGUSR1 at ", text)) == restarts + len(late), tail(log)
    assert len(re.findall(rf"job {job_id}: the step ended \(\d+\) at .*; requeued", text)) == restarts
    saved = re.findall(r"rank 0: saved checkpoint step-(\d+) ([\d.]+) s after SIGTERM", text)
    resumed = re.findall(r"resumed from \S+/checkpoints/step-(\d+) \(step (\d+)", text)
    assert len(saved) == restarts and all(float(took) < 5 for _, took in saved), tail(log)
    assert [s for s, _ in saved] == [r for r, _ in resumed], tail(log)  # each from the one just saved
    assert "stopping at once, no save" not in text  # each rank got one SIGTERM, from its agent
    assert f"job {job_id} (restart {restarts})" in text

    run_dir = cut_dir / "outputs" / job_id
    summary = read_summary(run_dir)  # every step of the 8 epochs trained once, across the attempts
    assert (summary["steps"], summary["epochs"]) == (8 * 20480 // summary["global_batch"], 8), summary
    assert torch.load(run_dir / "model.pt", weights_only=True)  # the results, written by the last attempt
    [launch] = owners(run_dir)  # every attempt belongs to the one launch of this SLURM job
    assert f"slurm:{job_id}" in launch

    # for the record (pytest -s): how long after the warning the ranks saved, how long a
    # requeued job waited to run again
    pending = {r: t for t, state, r in reversed(states) if state == "PENDING"}
    running = {r: t for t, state, r in reversed(states) if state == "RUNNING"}
    waits = [round(running[r] - pending[r], 1) for r in map(str, range(1, restarts + 1))
             if r in pending and r in running]
    warned = re.findall(rf"job {job_id}: SIGUSR1 at (\S+),", text)
    got = re.findall(r"\[[\d-]+ ([\d:]+),\d+\]\[ddp_lab\]\[WARNING\] - rank 0 got SIGTERM", text)
    print(f"\njob {job_id}: {restarts} requeues; warnings at {warned}, rank 0 got SIGTERM at {got} "
          f"and saved {[float(t) for _, t in saved]} s later, at steps {[int(s) for s, _ in saved]}; "
          f"requeued to running again in {waits} s")


# Stands in for torchrun on each node: the training has ended and written its results, and
# the process is still on its way out when the warning's SIGTERM reaches it (torchrun then exits 1).
ENDED_AS_WARNED = """#!/bin/bash
mkdir -p "outputs/$SLURM_JOB_ID" && touch "outputs/$SLURM_JOB_ID/summary.json" "outputs/$SLURM_JOB_ID/model.pt"
trap 'echo "$(hostname): SIGTERM after the results"; exit 1' TERM
echo "$(hostname): results written"
while true; do sleep 0.1; done
"""


def test_a_warning_that_comes_after_the_training_ended_does_not_requeue(
        slurm, tmp_path, cancel_on_failure):
    fake = tmp_path / "torchrun"
    fake.write_text(ENDED_AS_WARNED)
    fake.chmod(0o755)
    job_id = slurm.submit(tmp_path, [], TORCHRUN=str(fake))
    cancel_on_failure.append(job_id)
    log = tmp_path / f"slurm-{job_id}.out"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("results written") == 2):
        assert time.monotonic() < deadline, tail(log)
        time.sleep(0.2)
    assert slurm.run("scancel", "--batch", "--signal=USR1", job_id).returncode == 0  # the warning
    job = slurm.wait(job_id, log, timeout=60)
    text = log.read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "0"), tail(log)
    assert text.count("SIGTERM after the results") == 2, tail(log)  # the stop did reach both nodes
    assert re.search(rf"job {job_id}: the step ended \(1\) at \S+ after the training had ended "
                     rf"\(outputs/{job_id} holds its results\): not requeued", text), tail(log)
    assert "requeued to continue" not in text


def machine_state() -> tuple:
    """What up makes and down must remove: links, routes, namespaces, files, daemons."""
    from ddp_lab.tools.cluster.commands import ip
    listings = tuple(sorted(os.listdir(d)) if os.path.isdir(d) else None
                     for d in ("/run/netns", "/etc/netns", "/etc/slurm", "/run/ddp_lab-slurm"))
    daemons = sorted(p for p in os.listdir("/proc") if p.isdigit() and _mentions(p, "/run/ddp_lab-slurm/"))
    return ip("-br", "link"), ip("-4", "route", "show", "table", "all"), listings, daemons


def _mentions(pid: str, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def test_up_and_down_leave_the_machine_as_it_was(slurm):
    """A second cluster beside the module's: made, then removed without a trace."""
    name = f"pt{uuid.uuid4().hex[:8]}"
    before = machine_state()
    try:
        up = subprocess.run(["bash", str(LOCAL), "up", "--name", name, "--hosts", "1", "--port",
                             str(free_port()), "--private"], capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"{name}-0 idle {len(os.sched_getaffinity(0))} " in up.stdout  # 1 host: every core
        during = machine_state()
        assert during[0] != before[0] and f"sl-{name}" in during[0]  # the login node's link
        assert len(during[3]) == len(before[3]) + 3  # munged, slurmctld, one slurmd
    finally:
        down = subprocess.run(["bash", str(LOCAL), "down", "--name", name], capture_output=True,
                              text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert machine_state() == before


def test_a_failed_up_says_why_and_removes_what_it_made(slurm, tmp_path):
    """A slurmd that cannot start: one line naming it, and nothing left but the logs."""
    name = f"pt{uuid.uuid4().hex[:8]}"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "slurmd").write_text("#!/bin/sh\necho 'slurmd: fatal: no such luck' >&2\nexit 1\n")
    (fake / "slurmd").chmod(0o755)
    before = machine_state()
    up = subprocess.run(["bash", str(LOCAL), "up", "--name", name, "--hosts", "1", "--port",
                         str(free_port()), "--private"], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    if up.returncode == 0:  # never expected; take it down before failing
        subprocess.run(["bash", str(LOCAL), "down", "--name", name], capture_output=True, timeout=300)
    assert up.returncode == 2
    assert f"error: slurmd on {name}-0 did not start: slurmd: fatal: no such luck" in up.stderr
    logs = Path(f"/tmp/ddp_lab-slurm-{name}-failed-up")
    assert f"its logs: {logs}" in up.stderr and (logs / "slurm.conf").exists()
    shutil.rmtree(logs)
    assert machine_state() == before
