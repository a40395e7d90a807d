"""ddp_lab.tools.rerun_record: a record's script run again into a folder of this machine's, the old one untouched."""
from __future__ import annotations

import datetime
import json

import pytest

from ddp_lab.telemetry.provenance import machine_facts
from ddp_lab.tools import rerun_record
from ddp_lab.tools.rerun_record import main

# what a record's run.sh does: writes beside itself, from the directory it was started in
WRITES_BESIDE_ITSELF = 'here=$(dirname "$0")\npwd > "$here/figures.txt"\necho measured\n'


@pytest.fixture
def records(tmp_path):
    def make(name, script=WRITES_BESIDE_ITSELF):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.sh").write_text(script)
        (folder / "helper.py").write_text("print('a helper the script calls')\n")
        (folder / "figures.txt").write_text("the first machine's figures\n")
        return folder
    return make


@pytest.fixture(scope="module")
def new_prefix():
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return f"{today}_{machine_facts()['machine']}_"


def test_a_record_reruns_into_a_folder_of_this_machines_and_the_old_one_stays(records, new_prefix):
    old = records("2026-01-01_oldbox-2c_keep-control")
    main([str(old)])
    new = old.parent / f"{new_prefix}keep-control"
    assert sorted(p.name for p in new.iterdir()) == ["figures.txt", "helper.py", "record.json", "rerun.log",
                                                     "run.sh"]
    assert (new / "figures.txt").read_text().strip() == str(rerun_record.REPO)  # run from the repository root
    assert (new / "rerun.log").read_text() == "measured\n"
    assert (old / "figures.txt").read_text() == "the first machine's figures\n"
    record = json.loads((new / "record.json").read_text())
    assert (record["rerun_of"], record["exit_code"], record["command"]) == (str(old), 0, f"sh {new / 'run.sh'}")


def test_a_folder_already_there_is_never_written_into(records, new_prefix):
    old = records("2026-01-01_oldbox-2c_peers-race")
    main([str(old)])
    new = old.parent / f"{new_prefix}peers-race"
    (new / "figures.txt").write_text("this morning's figures\n")
    with pytest.raises(SystemExit, match="is already there, and is never written into"):
        main([str(old)])
    assert (new / "figures.txt").read_text() == "this morning's figures\n"


def test_every_refusal_comes_before_anything_runs(records, new_prefix, tmp_path):
    good = records("2026-01-01_oldbox-2c_host-malloc")
    without = tmp_path / "2026-01-01_oldbox-2c_no-script"
    without.mkdir()
    with pytest.raises(SystemExit, match="no-script/run.sh is not there"):
        main([str(good), str(without)])
    misnamed = records("keep-control")
    with pytest.raises(SystemExit, match="is not named <date>_<machine>_<what>"):
        main([str(good), str(misnamed)])
    assert not (tmp_path / f"{new_prefix}host-malloc").exists()


def test_a_failing_script_stops_the_records_after_it(records, new_prefix, tmp_path):
    failing = records("2026-01-01_oldbox-2c_fails", script="echo half way\nexit 3\n")
    after = records("2026-01-01_oldbox-2c_after")
    with pytest.raises(SystemExit, match=r"run.sh exited 3 .*the records after it were not run"):
        main([str(failing), str(after)])
    new = tmp_path / f"{new_prefix}fails"
    assert json.loads((new / "record.json").read_text())["exit_code"] == 3
    assert (new / "rerun.log").read_text() == "half way\n"
    assert not (tmp_path / f"{new_prefix}after").exists()


def test_a_dry_run_makes_nothing(records, new_prefix, tmp_path, capsys):
    old = records("2026-01-01_oldbox-2c_fsdp-overlap")
    main([str(old), "--dry-run"])
    new = tmp_path / f"{new_prefix}fsdp-overlap"
    assert capsys.readouterr().out == f"{old} -> {new}\n" and not new.exists()
