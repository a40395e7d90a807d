"""A rank's last line as torchrun's root cause: the error file, read back by torch's own code."""
import json
import threading

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddp_lab.config import error_file

LINE = "ddp_lab: error: data.num_workers=-1 must be >= 0"


@pytest.fixture
def path(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv(error_file.ENV, str(path))
    return path


def test_torchrun_reads_our_line_as_the_root_cause(path):
    assert error_file.write(LINE) is True
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=2, error_file=str(path))
    assert failure.message["message"] == LINE
    assert failure.error_file == str(path)
    report = ChildFailedError("ddp_lab.train", {1: failure}).format_msg()
    assert f"  traceback : {LINE}\n" in report
    assert "  exitcode  : 2 (pid: 4242)" in report
    assert "<N/A>" not in report and "To enable traceback" not in report


def test_the_first_line_stays(path):
    assert error_file.write(LINE) is True
    assert error_file.write("ddp_lab: rank 0 stopped at step 3 in gradient sync: ...") is False
    assert json.loads(path.read_text())["message"]["message"] == LINE
    assert [p.name for p in path.parent.iterdir()] == ["error.json"]  # no temporary left


def test_threads_racing_leave_one_whole_file(path):
    won, go = [], threading.Barrier(8)

    def write(i):
        go.wait()
        if error_file.write(f"line {i}"):
            won.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert ProcessFailure(0, 1, 1, str(path)).message["message"] == f"line {won[0]}"


def test_nothing_is_written_outside_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv(error_file.ENV, raising=False)
    assert error_file.write(LINE) is False
    monkeypatch.setenv(error_file.ENV, "")  # what torchrun sets where it wants no file
    assert error_file.write(LINE) is False


def test_record_keeps_our_line_and_records_an_exception_otherwise(path):
    handler = error_file.KeepFirst()
    error_file.write(LINE)
    handler.record_exception(RuntimeError("the unwinding after it"))
    assert json.loads(path.read_text())["message"]["message"] == LINE
    path.unlink()
    try:
        raise ValueError("no line said")
    except ValueError as e:
        handler.record_exception(e)
    assert ProcessFailure(0, 1, 1, str(path)).message["message"] == "ValueError: no line said"


# ---------------------------------------------------------------- through torchrun
@pytest.mark.system
def test_a_refused_launch_is_torchruns_root_cause(tiny_fmnist, tmp_path):
    from tests.conftest import run_module, tiny_overrides
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, tmp_path / "run")
                      + ["data.num_workers=-1"], nproc=2, timeout=120)
    assert proc.returncode == 1  # torchrun's own exit on a failed worker (ChildFailedError)
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddp_lab: error:")]
    # torchrun ends the other rank as soon as one fails, so it may not live to say its line
    assert said in ([LINE], [LINE, LINE]), proc.stderr[-3000:]
    root = proc.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert f"traceback : {LINE}\n" in root, proc.stderr[-3000:]
    assert "exitcode  : 2 (pid:" in root
    assert "To enable traceback" not in proc.stderr
    # a rank torchrun ended before it said its line is listed by its signal, with no file
    lines = proc.stderr.splitlines()
    for i, ln in enumerate(lines):
        if "error_file: <N/A>" in ln:
            assert "traceback : Signal 15 (SIGTERM) received by PID" in lines[i + 1], proc.stderr[-3000:]
    assert 1 <= proc.stderr.count(f"traceback : {LINE}") <= len(said)  # no rank listed twice
