"""A finished run's results on disk: model.pt and summary.json (rank 0).

Both are written under a temporary name and renamed into place, so a kill
or a full disk never leaves half a file, nor replaces a good one; weights
that are not finite are never written (ddp_lab.divergence should have
stopped the run first). summary.json comes last: its presence means the
run completed.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ddp_lab.checkpoint.files import nbytes, write_error
from ddp_lab.config import RunFailed
from ddp_lab.divergence import all_finite
from ddp_lab.metrics import write_json_atomic


def write_results(run_dir: Path, model_state: dict, summary: dict) -> None:
    if not all_finite(model_state):
        raise RunFailed("refusing to write model.pt: the model holds non-finite weights")
    run_dir = Path(run_dir)
    tmp = run_dir / ".model.pt.tmp"
    try:
        torch.save(model_state, tmp)
        os.replace(tmp, run_dir / "model.pt")
        write_json_atomic(run_dir / "summary.json", summary)
    except (OSError, RuntimeError) as e:  # torch.save reports a short write as RuntimeError
        tmp.unlink(missing_ok=True)
        raise RunFailed(write_error("model.pt and summary.json", run_dir,
                                    nbytes(model_state), e)) from None


def is_complete(run_dir: Path) -> bool:
    return all((Path(run_dir) / f).exists() for f in ("model.pt", "summary.json"))
