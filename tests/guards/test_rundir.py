"""The run directory: unusable ones refused in one line, earlier results found, launches known."""
import json
import os

import pytest

from ddp_lab.config import ConfigError
from ddp_lab.guards import rundir
from tests.conftest import run_module, tiny_overrides


def test_a_path_under_a_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError) as e:
        rundir.check_usable(tmp_path / "afile" / "runs" / "r1")
    assert str(e.value) == (f"run directory {tmp_path}/afile/runs/r1 is not usable: "
                            f"{tmp_path}/afile is a file, not a directory. Choose another "
                            "with hydra.run.dir=<writable directory>")
    with pytest.raises(ConfigError, match="afile is a file, not a directory"):
        rundir.check_usable(tmp_path / "afile")


@pytest.fixture
def read_only_dir(mount_tmpfs):
    """A read-only filesystem: root may write anywhere else."""
    return mount_tmpfs("ro,size=1m")


def test_a_read_only_filesystem_is_refused(read_only_dir):
    with pytest.raises(ConfigError, match=f"run directory {read_only_dir}/run is not usable: "
                                          "it is on a read-only filesystem"):
        rundir.check_usable(read_only_dir / "run")


def test_earlier_results_name_what_is_there(tmp_path):
    assert rundir.earlier_results(tmp_path / "none") == []
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "rank0.log").write_text("a log is not a result")
    assert rundir.earlier_results(tmp_path) == []
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.x").write_bytes(b"")
    (tmp_path / "checkpoints" / "step-12").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-7").mkdir()
    assert rundir.earlier_results(tmp_path) == [
        "summary.json", "TensorBoard events in tb/", "checkpoints up to step-12"]


def test_launches_are_recorded_and_recognised(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    me = rundir.launch_identity()
    assert me[0].startswith("agent:") and f"/{os.getppid()}/" in me[0] and me[1] == "slurm:4242"
    assert not rundir.owned_by(tmp_path, me)
    rundir.record_launch(tmp_path, me, resumed_from=None)
    assert rundir.owned_by(tmp_path, me)
    assert rundir.owned_by(tmp_path, ["slurm:4242"])  # the same job, requeued: new agents
    assert not rundir.owned_by(tmp_path, ["slurm:1", "agent:other/0/1/2"])
    rundir.record_launch(tmp_path, ["slurm:4242", "agent:new/1/2/3"], resumed_from=None)
    rundir.record_launch(tmp_path, ["agent:stranger/1/2/3"], resumed_from="ck/step-5")
    launches = json.loads((tmp_path / "launches.json").read_text())["launches"]
    assert [sorted(x["owners"]) for x in launches] == [
        sorted([*me, "agent:new/1/2/3"]), ["agent:stranger/1/2/3"]]
    assert [x["resumed_from"] for x in launches] == [None, "ck/step-5"]


def test_a_launch_still_running_here_is_found_and_a_dead_or_own_one_is_not(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    running = rundir.launch_identity()  # this test's process: alive
    host, boot, pid, start = running[0].split(":", 1)[1].split("/")
    dead = f"agent:{host}/{boot}/{pid}/{int(start) + 1}"  # the same pid, another start: reused
    rundir.record_launch(tmp_path, [dead], resumed_from=None)
    assert rundir.live_launch(tmp_path, ["agent:me/1/2/3"]) is None
    rundir.record_launch(tmp_path, running, resumed_from=None)
    started = rundir.read_launches(tmp_path)[-1]["started_at"]
    assert rundir.live_launch(tmp_path, ["agent:me/1/2/3"]) == (
        f"process {os.getpid()} on {host}, started {started}")
    assert rundir.live_launch(tmp_path, running) is None  # our own launch, restarted
    elsewhere = f"agent:not-{host}/{boot}/{pid}/{start}"
    assert rundir._running(elsewhere) is None  # another host: not seen from here


@pytest.mark.system
def test_the_entry_point_refuses_an_unusable_run_dir_in_one_line(tiny_fmnist, tmp_path):
    (tmp_path / "afile").write_text("x")
    args = tiny_overrides(tiny_fmnist, tmp_path / "afile" / "run")
    proc = run_module("ddp_lab.train", args, nproc=0, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]
    assert [ln for ln in out.splitlines() if ln.strip()] == [
        f"ddp_lab: error: run directory {tmp_path}/afile/run is not usable: {tmp_path}/afile "
        "is a file, not a directory. Choose another with hydra.run.dir=<writable directory>"]


# ---------------------------------------------------------------- through the entry point
def _snapshot(run_dir):
    """Every file under run_dir and its bytes (launches.json and logs aside: they only grow)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.endswith(".log")}


def _logs(run_dir):
    return {p.name: p.read_bytes() for p in sorted(run_dir.glob("*.log"))}


@pytest.fixture(scope="module")
def finished_without_checkpoints(tiny_fmnist, tmp_path_factory):
    """A finished one-process run that kept no checkpoints (trainer.keep_ckpts=0)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        "trainer.keep_ckpts=0", "trainer.epochs=1"], nproc=0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


def _errors(text):
    return [ln for ln in text.splitlines() if ln.startswith("ddp_lab: error:")]


@pytest.mark.system
def test_resume_auto_never_overwrites_a_finished_run(finished_without_checkpoints, tiny_fmnist):
    run = finished_without_checkpoints
    before, logs = _snapshot(run), _logs(run)
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run) + [
        "trainer.resume=auto", "optim.lr=0.05"], nproc=0)
    assert proc.returncode == 2
    assert _errors(proc.stderr) == [
        f"ddp_lab: error: trainer.resume=auto: {run} already holds an earlier run (model.pt, "
        "summary.json, TensorBoard events in tb/) but no intact checkpoint to continue from, and "
        "will not overwrite it; start afresh in another directory (hydra.run.dir=... or "
        "DDP_LAB_RUN_ID=<name>)"]
    assert "Traceback" not in proc.stdout + proc.stderr
    # what Hydra wrote for the refused launch (its record, its log lines) was taken back
    assert _snapshot(run) == before and _logs(run) == logs


@pytest.mark.system
def test_a_refused_launch_stays_refused_when_torchrun_restarts_it(finished_without_checkpoints,
                                                                   tiny_fmnist):
    run = finished_without_checkpoints
    before, logs = _snapshot(run), _logs(run)
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run), nproc=2,
                      torchrun_args=["--max-restarts=1"])
    assert proc.returncode != 0
    errors = _errors(proc.stderr)
    assert len(errors) == 4, proc.stderr[-3000:]  # 2 ranks x 2 attempts, every one refused
    assert all("which a new run there would overwrite" in e for e in errors)
    assert _snapshot(run) == before and _logs(run) == logs


@pytest.mark.system
def test_a_complete_run_resumed_writes_nothing(tiny_fmnist, tmp_path):
    run = tmp_path / "run"
    args = tiny_overrides(tiny_fmnist, run) + ["trainer.epochs=1"]
    assert run_module("ddp_lab.train", args, nproc=0).returncode == 0
    before = _snapshot(run)
    launches = (run / "launches.json").read_text()
    proc = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{run} holds a complete run (step 8 of 8): nothing left to do, nothing written" in proc.stdout
    after = _snapshot(run)
    assert {k: v for k, v in after.items() if not k.startswith(".hydra/launch-")} == before
    assert (run / "launches.json").read_text() == launches


@pytest.mark.system
def test_a_second_launch_into_a_live_run_directory_is_refused_and_writes_nothing(
        tiny_fmnist, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import for_the_data, free_port
    run = tmp_path / "run"
    args = for_the_data(tiny_overrides(tiny_fmnist, run) + [
        "data=synthetic", "data.num_train=60000", "data.num_test=512", "trainer.compile=false",
        "trainer.epochs=5", "trainer.amp=off"])
    first = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "-m",
         "ddp_lab.train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (run / "launches.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None and (run / "launches.json").exists()
        hydra_before = sorted(p.name for p in (run / ".hydra").iterdir())
        second = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=2, timeout=120)
        assert second.returncode != 0
        errors = set(_errors(second.stderr))
        assert len(errors) == 1, second.stderr[-3000:]  # both ranks, the same line
        assert errors.pop().startswith(
            f"ddp_lab: error: run directory {run} is in use by a running job (torchrun agent "
            f"{first.pid} on ")
        assert sorted(p.name for p in (run / ".hydra").iterdir()) == hydra_before
        assert len(rundir.read_launches(run)) == 1
    finally:
        first.send_signal(signal.SIGTERM)  # the first job saves on its way out
        first.wait(timeout=60)
    assert any(p.name.startswith("step-") for p in (run / "checkpoints").iterdir())
