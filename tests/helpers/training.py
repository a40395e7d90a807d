"""One rank's run of the trainer inside a test's process group (tests/multiproc.py): the config composed as
`python -m ddp_lab.train` composes it, the Trainer built, fitted and closed."""
from __future__ import annotations

from pathlib import Path

import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer


def fit_in_rank(rank: int, world_size: int, overrides: list, run_dir) -> tuple[dict, str]:
    """(the run's summary, the line its resume said or "") of this rank's run on gloo."""
    from hydra import compose, initialize_config_module

    from ddp_lab.config import schema
    schema.register()
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose(config_name="train", overrides=list(overrides))
    trainer = Trainer.from_config(cfg, DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), Path(run_dir))
    try:
        said = trainer.resumed.describe(trainer.step, "", world_size) if trainer.resumed else ""
        return trainer.fit(), said
    finally:
        trainer.close()
