"""A checkpoint resumes under another sync mode (checkpoint/whole_state.py, compat.MOVABLE): its weights and
optimizer state read by parameter name, a tensor at a time, and cut the new mode's way, at another world size
too. A ddp checkpoint continues under fsdp and under zero stage 3 at 3 ranks, a zero stage 3 one under ddp at 3,
an fsdp one under zero stage 1 and a zero stage 3 one under stage 2 at 2: each ends within 1e-4 of the run that
never stopped (the modes take the same steps: AdamW amplifies
the other order of the float sums, test_zero.py). What may not change is still refused in one line."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from ddp_lab.checkpoint.whole_state import CheckpointOptimizerState, CheckpointWeights
from ddp_lab.config import ConfigError
from tests.helpers.training import fit_in_rank
from tests.multiproc import run_in_processes

GPT = ["model=gpt", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "data=text",
       "data.batch_size=12", "optim=adamw", "optim.lr=0.003", "optim.warmup_epochs=0", "optim.warmup_steps=0",
       "trainer.epochs=1", "trainer.max_steps=4", "trainer.ckpt_every_steps=2", "trainer.keep_ckpts=5",
       "trainer.amp=off", "trainer.compile=false", "trainer.progress=false"]
SOURCES = {"ddp": ["sync=ddp"], "zero3": ["sync=zero", "sync.zero_stage=3"], "fsdp": ["sync=fsdp"]}
RESUMED = {3: {"ddp_as_fsdp": ("ddp", ["sync=fsdp"]), "zero3_as_ddp": ("zero3", ["sync=ddp"]),
               "ddp_as_zero3": ("ddp", ["sync=zero", "sync.zero_stage=3"])},
           2: {"fsdp_as_zero1": ("fsdp", ["sync=zero", "sync.zero_stage=1"]),
               "zero3_as_zero2": ("zero3", ["sync=zero", "sync.zero_stage=2"])}}


def _sources(rank: int, world_size: int, tmp: str) -> None:
    for name, sync in SOURCES.items():
        fit_in_rank(rank, world_size, [*GPT, f"data.path={tmp}/corpus.txt", *sync], Path(tmp) / name)


def _resume(rank: int, world_size: int, tmp: str) -> dict:
    said = {}
    for name, (source, sync) in RESUMED[world_size].items():
        step2 = Path(tmp) / source / "checkpoints" / "step-2"
        said[name] = fit_in_rank(rank, world_size, [*GPT, f"data.path={tmp}/corpus.txt", *sync,
                                                    f"trainer.resume={step2}"], Path(tmp) / name)[1]
    return said


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("across")
    rng = random.Random(0)
    words = ["shard", "gather", "rank", "step", "the", "of", "loss"]
    (tmp / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(3000)))
    run_in_processes(_sources, 2, str(tmp), timeout=600)
    said = run_in_processes(_resume, 3, str(tmp), timeout=600)[0]
    said.update(run_in_processes(_resume, 2, str(tmp), timeout=600)[0])
    return tmp, said


def _weights(run: Path) -> dict:
    return torch.load(run / "model.pt", weights_only=True)


@pytest.mark.parametrize("name", ["ddp_as_fsdp", "zero3_as_ddp", "ddp_as_zero3", "fsdp_as_zero1", "zero3_as_zero2"])
def test_a_checkpoint_continues_under_another_sync_mode_as_if_it_never_stopped(runs, name):
    tmp, said = runs
    source = RESUMED[3].get(name, RESUMED[2].get(name))[0]
    got, whole_run = _weights(tmp / name), _weights(tmp / source)
    at_step_2 = CheckpointWeights(tmp / source / "checkpoints" / "step-2").state_dict()
    assert got.keys() == whole_run.keys()
    assert max((got[k] - whole_run[k]).abs().max().item() for k in got) < 1e-4, name
    assert max((got[k] - at_step_2[k]).abs().max().item() for k in got) > 1e-3  # it took steps 3 and 4
    assert said[name].endswith("its weights and optimizer state read by parameter name, a tensor at a time, and "
                               "cut for this sync mode")
    assert f"written under sync={SOURCES[source][0].removeprefix('sync=')}" in said[name]


def test_a_periodic_mode_or_another_model_is_still_refused_in_one_line(runs, compose_train):
    from ddp_lab.checkpoint.compat import config_subset, validate
    from ddp_lab.checkpoint.files import read_meta
    tmp, _ = runs
    step2 = tmp / "ddp" / "checkpoints" / "step-2"
    meta = read_meta(step2)
    base = [*GPT, f"data.path={tmp}/corpus.txt"]
    assert validate(step2, meta, config_subset(compose_train([*base, "sync=zero", "sync.zero_stage=2"]))) is True
    with pytest.raises(ConfigError, match=r"config hash differs \(.*sync.options: 'DDPOptions' in the checkpoint "
                                          r"vs 'DiLoCoOptions' now"):
        validate(step2, meta, config_subset(compose_train([*base, "sync=diloco"])))
    with pytest.raises(ConfigError, match=r"config hash differs \(.*model.n_layer: 2 in the checkpoint vs 3 now"):
        validate(step2, meta, config_subset(compose_train([*base, "model.n_layer=3", "sync=fsdp"])))


def test_a_checkpoint_without_its_optimizers_layout_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"was written before checkpoints recorded their optimizer's layout: "
                                          r"resume it under the sync mode that wrote it"):
        CheckpointOptimizerState(tmp_path, {"optimizer": {}})
