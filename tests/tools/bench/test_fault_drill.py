"""bench.fault_drill: a fault's time to the last exit, what was said, and a record that is never overwritten."""
import json

import pytest

from ddp_lab.tools.bench import fault_drill


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fault_drill.main(["--kinds", "explode"])
    assert ("--kinds: explode not among raise, kill, hang, mismatch, nan, term, stop, stop@compile, "
            "stop@evaluation, stop@checkpoint, hang@data") in capsys.readouterr().err
    (tmp_path / "results.json").write_text("{}")  # an earlier run's
    with pytest.raises(SystemExit, match="already holds an earlier run's files; choose another --out"):
        fault_drill.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # untouched


@pytest.mark.system
def test_a_raise_is_timed_and_recorded(tmp_path, capsys):
    out = tmp_path / "faults"
    assert fault_drill.main(["--kinds", "raise", "--timeout-s", "20", "--out", str(out)]) == 0
    (result,) = json.loads((out / "results.json").read_text())["results"]
    assert result["kind"] == "raise" and result["exit_status"] == 1
    assert 0 < result["fault_to_exit_s"] < 20
    assert any("rank 1 stopped at step 5" in line and "DDP_LAB_FAULT" in line
               for line in result["said"])
    record = json.loads((out / "record.json").read_text())
    assert record["command"].endswith("-m ddp_lab.tools.bench.fault_drill --kinds raise --timeout-s 20 "
                                      f"--out {out}")
    assert "| raise | 1 |" in capsys.readouterr().out
    assert "DDP_LAB_FAULT" in (out / "raise.log").read_text()  # the raw lines beside the record
