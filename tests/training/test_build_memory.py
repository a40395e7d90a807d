"""What building the model costs each rank, measured (summary.json's before_build_mb_by_rank and
build_peak_mb_by_rank): a whole build holds the whole model on every rank; zero stage 3 and fsdp make it a unit
at a time (models/meta_init.py), so their growth while building is this rank's shard and one unit, under the
whole model's weights, from a pretrained directory too (read a tensor at a time into memory of its own, the
files closed once built). Our GPT (200 MiB of weights in 16 blocks) and transformers' Llama as it is (180
MiB), 2 ranks each, built and not trained, each run a process of its own."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.multiproc import run_in_processes

COMMON = ["data.batch_size=8", "trainer.amp=off", "trainer.compile=false", "trainer.progress=false",
          "trainer.keep_ckpts=0"]
GPT = ["model=gpt", "model.n_layer=16", "model.n_embd=512", "model.n_head=8", "model.block_size=32", "data=text"]
GPT_MIB = 16 * 12 * 512 * 512 * 4 / 2**20  # its blocks' weights (200)
LLAMA = ["model=hf_llama", "model.overrides.num_hidden_layers=16", "model.overrides.hidden_size=512",
         "model.overrides.intermediate_size=1408", "model.overrides.num_attention_heads=8",
         "model.overrides.num_key_value_heads=4", "data=text_documents"]  # (transformers' own, as it is)
LLAMA_MIB = 16 * (2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 1408) * 4 / 2**20  # its blocks' weights (180)
RUNS = {"ddp": [*GPT, "sync=ddp"], "zero3": [*GPT, "sync=zero", "sync.zero_stage=3"], "fsdp": [*GPT, "sync=fsdp"],
        "llama ddp": [*LLAMA, "sync=ddp"], "llama zero3": [*LLAMA, "sync=zero", "sync.zero_stage=3"],
        "llama fsdp": [*LLAMA, "sync=fsdp"]}


def _build(rank: int, world_size: int, tmp: str, run: str, overrides: list) -> tuple[float, float]:
    """(MiB before the build, the peak once built) on this rank: a process of its own for each run (the peak is
    the process's high-water mark)."""
    from hydra import compose, initialize_config_module

    from ddp_lab.config import schema
    from ddp_lab.distributed import DistEnv
    from ddp_lab.training.trainer import Trainer
    schema.register()
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose(config_name="train", overrides=[*overrides, *COMMON])
    trainer = Trainer.from_config(cfg, DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), Path(tmp) / run)
    try:
        return trainer.parts.built_mb
    finally:
        trainer.close()


def _llama_directory(out: Path) -> None:
    """LLAMA's model saved by save_pretrained (180 MiB of safetensors)."""
    from ddp_lab.models.hf import transformers_model
    over = dict(o.removeprefix("model.overrides.").split("=") for o in LLAMA if o.startswith("model.overrides."))
    preset = {"vocab_size": 256, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0,
              "pad_token_id": 0, **{k: int(v) for k, v in over.items()}}
    transformers_model("llama", "causal_lm", preset).save_pretrained(out)


@pytest.mark.slow
def test_stage_3_and_fsdp_build_a_rank_under_the_whole_models_weights(tmp_path):
    _llama_directory(tmp_path / "pretrained")
    runs = {**RUNS, **{f"llama {mode} pretrained": [*RUNS[f"llama {mode}"], f"model.pretrained={tmp_path}/pretrained"]
                       for mode in ("zero3", "fsdp")}}
    built = {run: run_in_processes(_build, 2, str(tmp_path), run, overrides, timeout=300)
             for run, overrides in runs.items()}
    for model, whole in (("", GPT_MIB), ("llama ", LLAMA_MIB)):
        for rank in range(2):
            for mode in ("zero3", "fsdp", "zero3 pretrained", "fsdp pretrained")[:2 + 2 * bool(model)]:
                before, peak = built[model + mode][rank]  # half the model, one unit (a sixteenth), some slack
                assert 0 < peak - before < 0.75 * whole, (model, mode, rank, built)
            before, peak = built[model + "ddp"][rank]
            assert peak - before > whole, (model, rank, built)  # the whole model (and DDP's buckets beside it)
