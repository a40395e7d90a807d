"""ddp_lab.tools.consolidate: any checkpoint's weights as one safetensors file (or a directory from_pretrained
loads), equal to the run's model.pt, from the whole weights of ddp, the flat unit pieces of zero stage 3 and
the rows of fsdp and HSDP, at 2 ranks. One launch: the runs go one after another."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_lab.tools.consolidate import consolidate
from tests.helpers.training import fit_in_rank
from tests.multiproc import run_in_processes

GPT = ["model=gpt", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "data=text",
       "data.batch_size=16"]
RUNS = {"ddp": [*GPT, "sync=ddp"], "zero3": [*GPT, "sync=zero", "sync.zero_stage=3"],
        "zero3_bf16": [*GPT, "sync=zero", "sync.zero_stage=3", "trainer.amp=bf16"],
        "fsdp": [*GPT, "sync=fsdp"], "hsdp": [*GPT, "sync=fsdp", "sync.islands=2"]}
HF_RUN = ["model=hf_gpt2", "data=text_documents", "data.batch_size=16", "sync=zero", "sync.zero_stage=3"]


def _train(rank: int, world_size: int, tmp: str, runs: dict) -> None:
    for name, overrides in runs.items():
        common = [f"data.path={tmp}/corpus.txt", "optim=adamw", "optim.warmup_epochs=0", "trainer.epochs=1",
                  "trainer.max_steps=3", "trainer.compile=false", "trainer.progress=false"]
        amp = [] if any(o.startswith("trainer.amp=") for o in overrides) else ["trainer.amp=off"]
        fit_in_rank(rank, world_size, [*overrides, *common, *amp], Path(tmp) / name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("consolidate")
    rng = random.Random(0)
    words = ["shard", "gather", "rank", "step", "the", "of", "loss"]
    (tmp / "corpus.txt").write_text("\n%\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
                                                 for _ in range(300)))
    every = {**RUNS, **({"hf_zero3": HF_RUN} if _has_transformers() else {})}
    run_in_processes(_train, 2, str(tmp), every, timeout=600)
    return tmp, every


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_every_mode_consolidates_to_its_model_pt(runs):
    from safetensors.torch import load_file
    tmp, every = runs
    for name in every:
        out = consolidate(tmp / name, tmp / f"{name}.safetensors")
        got, want = load_file(out), torch.load(tmp / name / "model.pt", weights_only=True)
        assert set(got) <= set(want) and len(set(want) - set(got)) <= 1, name  # (a tied weight once)
        for k in got:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), (name, k)


def test_a_transformers_models_directory_loads_with_from_pretrained(runs):
    transformers = pytest.importorskip("transformers")
    tmp, _ = runs
    out = consolidate(tmp / "hf_zero3")  # (default: <run>/consolidated/)
    assert out == tmp / "hf_zero3" / "consolidated" and (out / "config.json").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    want = torch.load(tmp / "hf_zero3" / "model.pt", weights_only=True)
    assert all(torch.equal(loaded[k], want[k]) for k in want)
    sharded = consolidate(tmp / "hf_zero3", tmp / "hf_sharded", max_shard_mb=1)  # (as save_pretrained above a size)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) >= 2 and (sharded / "model.safetensors.index.json").is_file(), shards
    loaded = transformers.AutoModelForCausalLM.from_pretrained(sharded).state_dict()
    assert all(torch.equal(loaded[k], want[k]) for k in want)


def test_the_command_refuses_to_write_over_and_names_what_is_not_a_checkpoint(runs, tmp_path):
    tmp, _ = runs
    (tmp_path / "taken").mkdir()
    for args, said in (([str(tmp / "ddp"), "--out", str(tmp_path / "taken")], "taken exists: name another --out"),
                       ([str(tmp_path)], "is neither a checkpoint nor a run directory holding one")):
        out = subprocess.run([sys.executable, "-m", "ddp_lab.tools.consolidate", *args], capture_output=True, text=True)
        assert out.returncode == 2 and said in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
