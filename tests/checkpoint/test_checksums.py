"""Checksums off the critical path (checkpoint/files.py, checkpointer.py): each rank hashes its own file as it
writes it, and a resume checks the checksums of what each rank reads whole, no more."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from ddp_lab import checkpoint
from ddp_lab.checkpoint.checkpointer import Checkpointer
from ddp_lab.distributed import DistEnv
from tests.checkpoint.conftest import save_small


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_each_file_is_hashed_as_it_is_written_and_meta_json_holds_it(tmp_path, monkeypatch):
    hashed = []
    monkeypatch.setattr(checkpoint.files, "_sha256", lambda p: hashed.append(p.name) or _sha(p))
    path, _, _ = save_small(tmp_path, 3)
    assert hashed == []  # nothing read back to seal it
    files = json.loads((path / "meta.json").read_text())["files"]
    assert set(files) == {"rank0.pt", "state.pt"}
    for name, want in files.items():
        assert want == {"bytes": (path / name).stat().st_size, "sha256": _sha(path / name)}


def test_a_resume_checks_only_the_checksums_of_what_a_rank_reads(tmp_path, monkeypatch):
    path, _, _ = save_small(tmp_path, 3)
    hashed = []
    real = checkpoint.files._sha256
    monkeypatch.setattr(checkpoint.files, "_sha256", lambda p: hashed.append(p.name) or real(p))
    assert checkpoint.newest(tmp_path, verify=()) == path and hashed == []  # sizes only
    ckpt = _checkpointer(tmp_path, rank=0, world_size=1)
    assert ckpt._damaged(path) is None and sorted(hashed) == ["rank0.pt", "state.pt"]


def _checkpointer(run_dir: Path, rank: int, world_size: int) -> Checkpointer:
    """A Checkpointer of `run_dir` resuming auto, without a config (the compatibility check is not tested here)."""
    ckpt = Checkpointer.__new__(Checkpointer)
    ckpt.keep, ckpt.resume_setting, ckpt.seed = 2, "auto", 0
    ckpt.env = DistEnv(rank, world_size, 0, torch.device("cpu"), "none")
    ckpt.run_dir, ckpt.root, ckpt.subset, ckpt.choice = run_dir, run_dir / "checkpoints", {}, None
    return ckpt


def test_a_rank_that_finds_its_own_file_damaged_names_it(tmp_path):
    path, _, _ = save_small(tmp_path, 3)
    data = bytearray((path / "rank0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only its checksum tells
    (path / "rank0.pt").write_bytes(bytes(data))
    assert checkpoint.problem(path, verify=()) is None
    assert _checkpointer(tmp_path, 0, 1)._damaged(path) == "rank 0: rank0.pt does not match its checksum (corrupt)"


def test_a_damaged_newest_checkpoint_is_skipped_at_resume(tmp_path, caplog, monkeypatch):
    run = tmp_path / "run"
    good, _, _ = save_small(run / "checkpoints", 2)
    bad, _, _ = save_small(run / "checkpoints", 4)
    data = bytearray((bad / "rank0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / "rank0.pt").write_bytes(bytes(data))
    ckpt = _checkpointer(run, 0, 1)
    chosen = []
    monkeypatch.setattr(checkpoint.checkpointer, "validate", lambda path, meta, subset: chosen.append(path))
    monkeypatch.setattr(checkpoint.checkpointer, "load", lambda path, rank, device, own, mapped: ({}, {}))
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        resumed = ckpt.resume()
    assert resumed.path == good and chosen == [good]
    assert f"skipping checkpoint {bad}: rank 0: rank0.pt does not match its checksum" in caplog.text
