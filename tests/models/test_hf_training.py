"""transformers' GPT-2 and Llama as they are (model=hf_gpt2, model=hf_llama: no wrapper), fine-tuned on dict
samples (data=text_documents) from one save_pretrained directory at 2 ranks under every sync mode (islands: one
island of fsdp, whose DiLoCo leaves DDP's steps as they are): each ends within 1e-4 of DDP, zero stage 3 and
fsdp build it a unit at a time, and the exported hf/ directory loads with from_pretrained and equals model.pt.
One launch a model: the modes run one after another."""
from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import pytest
import torch

from tests.helpers.training import fit_in_rank
from tests.multiproc import run_in_processes

transformers = pytest.importorskip("transformers")

MODES = {"ddp": ["sync=ddp"], "zero1": ["sync=zero", "sync.zero_stage=1"], "zero2": ["sync=zero", "sync.zero_stage=2"],
         "zero3": ["sync=zero", "sync.zero_stage=3"], "fsdp": ["sync=fsdp", "model.max_shard_mb=1"],  # (hf/ in files)
         "hsdp": ["sync=fsdp", "sync.islands=2"],
         # one island of 2 ranks, fsdp inside, DiLoCo across with outer lr 1 and no momentum: DDP's steps
         "islands": ["sync=diloco", "sync.islands=2", "sync/inner=fsdp", "sync.outer_lr=1.0",
                     "sync.outer_momentum=0.0"]}
UNIT_AT_A_TIME = ("zero3", "fsdp", "hsdp", "islands")


def _corpus(path: Path) -> None:
    """240 documents of 8 to 60 bytes, fortune-style (`%` lines between)."""
    rng = random.Random(0)
    words = ["data", "parallel", "shard", "gather", "reduce", "rank", "step", "loss", "the", "a", "of"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))[:60] for _ in range(240)]
    path.write_text("\n%\n".join(docs))


def _pretrained(name: str, out: Path) -> None:
    from omegaconf import OmegaConf

    from ddp_lab.models.hf import transformers_model
    preset = OmegaConf.load(Path(__file__).parents[2] / "conf" / "model" / f"{name}.yaml")
    torch.manual_seed(123)
    transformers_model(preset.config, "causal_lm", OmegaConf.to_container(preset.overrides)).save_pretrained(out)


def _fine_tune(rank: int, world_size: int, model: str, tmp: str) -> dict:
    out = {}
    for mode, sync in MODES.items():
        overrides = [f"model={model}", f"model.pretrained={tmp}/pretrained", "data=text_documents",
                     f"data.path={tmp}/corpus.txt", "data.batch_size=16", "optim=adamw", "optim.lr=0.003",
                     "optim.warmup_epochs=0", "optim.warmup_steps=0", "trainer.epochs=1", "trainer.max_steps=4",
                     "trainer.amp=off", "trainer.compile=false", "trainer.progress=false", "trainer.keep_ckpts=0",
                     *sync]
        run_dir = Path(tmp) / mode
        run_dir.mkdir(exist_ok=True)
        said = logging.FileHandler(run_dir / f"rank{rank}.log")  # (what train.py's logging writes there)
        logging.getLogger("ddp_lab").addHandler(said)
        logging.getLogger("ddp_lab").setLevel(logging.INFO)
        try:
            summary = fit_in_rank(rank, world_size, overrides, run_dir)[0]
        finally:
            logging.getLogger("ddp_lab").removeHandler(said)
        out[mode] = {"val_loss": summary["val_loss"], "train_loss": summary["train_loss"]}
    return out


@pytest.fixture(scope="module", params=["hf_gpt2", "hf_llama"])
def tuned(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    _corpus(tmp / "corpus.txt")
    _pretrained(request.param, tmp / "pretrained")
    ranks = run_in_processes(_fine_tune, 2, request.param, str(tmp), timeout=600)
    return tmp, ranks


def _weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)


def test_every_sync_mode_fine_tunes_it_as_ddp_does(tuned):
    tmp, ranks = tuned
    assert ranks[0] == ranks[1]  # every rank reports the same figures
    ddp = _weights(tmp / "ddp")
    start = transformers.AutoModelForCausalLM.from_pretrained(tmp / "pretrained").state_dict()
    assert max((ddp[k] - start[k]).abs().max().item() for k in ddp) > 5e-3  # it trained (AdamW: about lr a step)
    for mode in MODES:
        assert ranks[0][mode]["val_loss"] == pytest.approx(ranks[0]["ddp"]["val_loss"], abs=1e-4), mode
        got = _weights(tmp / mode)
        assert got.keys() == ddp.keys()
        assert max((got[k] - ddp[k]).abs().max().item() for k in ddp) < 1e-4, mode


def test_stage_3_and_fsdp_build_it_a_unit_at_a_time_from_the_directory(tuned):
    tmp, _ = tuned
    file_mb = (tmp / "pretrained" / "model.safetensors").stat().st_size / 2**20
    for mode in MODES:
        log = (tmp / mode / "rank0.log").read_text()
        said = "model built a unit at a time" in log
        assert said == (mode in UNIT_AT_A_TIME), mode
        assert ("copied into each unit as it is made" in log) == (mode in UNIT_AT_A_TIME), mode
        assert "model built whole on every rank" not in log
        if mode in UNIT_AT_A_TIME:  # rank 0 read its half of each unit's rows and the root whole, not the file
            read = float(re.search(r"it read ([0-9.]+) MiB of the pretrained safetensors", log).group(1))
            assert 0.4 * file_mb < read < 0.6 * file_mb, (mode, read, file_mb)


def test_the_exported_directory_loads_with_from_pretrained_and_equals_model_pt(tuned):
    tmp, _ = tuned
    assert [p.name for p in (tmp / "ddp" / "hf").glob("*.safetensors")] == ["model.safetensors"]
    shards = sorted(p.name for p in (tmp / "fsdp" / "hf").glob("*.safetensors"))  # (model.max_shard_mb=1)
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors", shards
    assert all((tmp / "fsdp" / "hf" / s).stat().st_size <= 10**6 + 10**5 for s in shards)  # (a header beside)
    assert (tmp / "fsdp" / "hf" / "model.safetensors.index.json").is_file()
    for mode in ("ddp", "fsdp"):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp / mode / "hf").state_dict()
        saved = _weights(tmp / mode)
        assert loaded.keys() == saved.keys()
        assert all(torch.equal(loaded[k], saved[k]) for k in saved), mode
