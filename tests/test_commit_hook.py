"""The repository's commit-msg hook (.githooks/commit-msg, installed by make) refuses subjects over 72 characters."""
import subprocess
from pathlib import Path

HOOK = Path(__file__).parents[1] / ".githooks" / "commit-msg"


def _run(tmp_path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(["sh", str(HOOK), str(path)], capture_output=True, text=True)


def test_a_subject_of_72_characters_passes_and_73_is_refused(tmp_path):
    assert _run(tmp_path, "a" * 72 + "\n\n" + "b" * 200 + "\n").returncode == 0  # the body may be long
    refused = _run(tmp_path, "# a comment git strips\n" + "a" * 73 + "\n")
    assert refused.returncode == 1 and "73 characters, over 72" in refused.stderr


def test_make_installs_it():
    assert "core.hooksPath .githooks" in (HOOK.parents[1] / "Makefile").read_text()
