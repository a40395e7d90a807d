"""The shipped configs compose, Hydra itself rejects unknown keys and wrong types, and
an error line reaches the shared stderr whole."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from ddp_lab.config import say
from ddp_lab.models import build_model, num_parameters


@pytest.mark.parametrize("model,params", [("lenet", 129_068), ("lenet_fast", 129_068), ("resnet18", 11_172_810)])
@pytest.mark.parametrize("data", ["fashion_mnist", "synthetic"])
def test_every_model_and_data_config_composes(compose_train, model, params, data):
    cfg = compose_train([f"model={model}", f"data={data}"])
    assert cfg.model.name == model
    assert cfg.data._target_ == f"ddp_lab.datasets.{'fashion_mnist' if data == 'fashion_mnist' else 'synthetic_images'}"
    assert cfg.data.batch_size == 512  # the GLOBAL batch (d2l: 256)
    assert num_parameters(build_model(cfg.model)) == params


@pytest.mark.parametrize("override,choices", [
    ("trainer.amp=bf61", "[auto, bf16, fp16, off]"),
    ("model.init=bogus", "[default, d2l]"),
    ("data.loader=magic", "[auto, device, dataloader]"),
    ("data.task=ranking", "[auto, classification, language_model, regression]"),
    ("sync.algo=tree", "[builtin, naive, ring, halving_doubling, ring_textbook, "
                       "halving_doubling_textbook, direct]"),
    ("sync.compress=int4", "[none, bf16, fp16]"),
    ("optim.schedule=step", "[constant, cosine]"),
    ("dist.backend=mpi", "[auto, gloo, nccl]"),
    ("dist.device=tpu", "[auto, cpu, cuda]"),
    ("dist.comm_threads=fast", "[auto, realtime, normal]"),
])
def test_a_value_off_its_list_is_refused_when_the_config_is_composed(compose_train, override, choices):
    key, value = override.split("=")
    with pytest.raises(ConfigCompositionException) as e:
        compose_train([override])
    assert f"Invalid value '{value}', expected one of {choices}" in str(e.value.__cause__)


def test_the_schema_lists_what_the_code_has():
    from ddp_lab.collectives import ALGORITHMS
    from ddp_lab.sync.options import Algo
    assert [a.value for a in Algo] == list(ALGORITHMS)


def test_a_choice_reads_as_its_string(compose_train):
    cfg = compose_train(["trainer.amp=bf16"])
    amp = cfg.trainer.amp
    assert amp == "bf16" and f"{amp}" == "bf16" and str(amp) == "bf16"
    assert {"bf16": 1}[amp] == 1


def test_defaults(compose_train):
    cfg = compose_train()
    from ddp_lab.sync import name_of, options_of
    assert (cfg.model.name, cfg.data._target_, name_of(options_of(cfg.sync)), cfg.sync.algo) == (
        "lenet_fast", "ddp_lab.datasets.fashion_mnist", "auto", "builtin")
    assert cfg.trainer.epochs == 10
    assert cfg.dist.backend == "auto"
    assert cfg.optim._target_ == "torch.optim.SGD"
    # LeNet's recipe (docs/defaults.md: the grid of 2026-11-29)
    assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.warmup_epochs, cfg.optim.clip_grad_norm) == (0.2, 0.9, 1.0, 2.0)


def test_the_chapter_keeps_its_plain_sgd_as_a_preset(compose_train):
    """optim=sgd_d2l: torch.optim.SGD(lr=0.2) at a constant rate, as d2l's chapter trains LeNet, whatever the
    shipped recipe (optim=sgd) becomes."""
    chapter = compose_train(["model=lenet", "optim=sgd_d2l", "data.batch_size=256"]).optim
    assert (chapter.lr, chapter.momentum, chapter.nesterov, chapter.weight_decay) == (0.2, 0.0, False, 0.0)
    assert (str(chapter.schedule), chapter.warmup_epochs, chapter.warmup_steps, chapter.clip_grad_norm) == (
        "constant", 0.0, 0, 0.0)


def test_overrides_are_typed(compose_train):
    cfg = compose_train(["trainer.epochs=3", "optim.lr=0.05", "data=synthetic", "data.image_shape=[3,32,32]"])
    assert cfg.trainer.epochs == 3 and isinstance(cfg.trainer.epochs, int)
    assert cfg.optim.lr == 0.05
    assert list(cfg.data.image_shape) == [3, 32, 32]


def test_unknown_key_is_rejected(compose_train):
    with pytest.raises(ConfigCompositionException, match="trainer.epoch"):
        compose_train(["trainer.epoch=3"])


def test_a_key_of_another_preset_is_rejected(compose_train):
    # lenet_fast's own key is no key of resnet18's: Hydra names it and the preset's schema
    with pytest.raises(ConfigCompositionException, match="crop_unused_border") as e:
        compose_train(["model=resnet18", "model.crop_unused_border=true"])
    assert "Key 'crop_unused_border' not in 'ImageModelConfig'" in str(e.value.__cause__)


def test_wrong_type_is_rejected(compose_train):
    with pytest.raises((ConfigCompositionException, ValidationError), match="ten"):
        compose_train(["trainer.epochs=ten"])


def test_unknown_group_option_is_rejected(compose_train):
    with pytest.raises(ConfigCompositionException, match="resnet50"):
        compose_train(["model=resnet50"])


def test_d2l_init_draws_from_normal_001(compose_train):
    import torch
    torch.manual_seed(0)
    net = build_model(compose_train(["model.init=d2l"]).model)
    w = net[7].weight  # the 800 -> 128 linear layer
    assert abs(w.std().item() - 0.01) < 0.0005
    assert abs(w.mean().item()) < 0.0005


def test_say_writes_a_line_and_its_newline_at_once(monkeypatch):
    # Ranks share torchrun's stderr, and print() writes the text and its newline
    # apart: two ranks failing together ran their lines into one (CI saw it).
    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, s):
            self.writes.append(s)

        def flush(self):
            pass

    err = Recorder()
    monkeypatch.setattr(sys, "stderr", err)
    say("ddp_lab: error: rank 1 gave up")
    assert err.writes == ["ddp_lab: error: rank 1 gave up\n"]


def test_two_ranks_saying_at_once_keep_their_lines_whole():
    code = ("import sys\nfrom ddp_lab.config import say\n"
            "for _ in range(5000):\n    say('ddp_lab: error: rank ' + sys.argv[1] + ' gave up')\n")
    read_end, write_end = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stderr=write_end)
             for r in (0, 1)]
    os.close(write_end)
    with os.fdopen(read_end) as f:
        lines = f.read().splitlines()
    assert [p.wait() for p in procs] == [0, 0]
    assert sorted(set(lines)) == ["ddp_lab: error: rank 0 gave up", "ddp_lab: error: rank 1 gave up"]
    assert len(lines) == 10_000


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), 0.0, -0.1, "0.1"])
def test_a_learning_rate_that_cannot_train_is_refused(compose_train, lr):
    from ddp_lab.config import ConfigError, schema
    cfg = compose_train()
    cfg.optim.lr = 0.1
    schema.check(cfg)
    with pytest.raises(ConfigError, match=f"optim.lr={lr} must be a positive, finite number"):
        schema.check(OmegaConf.merge(cfg, {"optim": {"lr": lr}}) if isinstance(lr, float) else _raw(cfg, lr))


def _raw(cfg, lr):
    """A config whose lr is not a number at all (as a hand-built config could hold)."""
    plain = OmegaConf.to_container(cfg)
    plain["optim"]["lr"] = lr
    return OmegaConf.create(plain)


def test_the_schema_is_the_one_source_of_defaults_and_help():
    import dataclasses

    from ddp_lab.config import schema
    for group, node in schema.GROUPS.items():
        for f in dataclasses.fields(node):
            assert f.metadata.get("help"), f"{group}.{f.name} has no help"
    # a preset file states only what differs: trainer and dist have none
    conf = Path(schema.__file__).parents[2] / "conf"
    for preset in ("trainer/default.yaml", "dist/default.yaml"):
        assert [ln for ln in (conf / preset).read_text().splitlines() if not ln.startswith("#")] == ["{}"]


def test_the_configuration_guide_holds_the_schema_reference():
    from ddp_lab.config import schema
    from tests.conftest import guide_reference
    assert guide_reference("ddp_lab.config.schema") == schema.reference(), (
        "docs/configuration.md is out of date: paste `python -m ddp_lab.config.schema` between its markers")
    from ddp_lab.sync import reference
    assert guide_reference("ddp_lab.sync.reference") == reference.reference(), (
        "docs/configuration.md is out of date: `make references`")


@pytest.mark.parametrize("model", ["lenet", "lenet_fast", "resnet18"])
def test_a_tool_gets_a_model_config_as_a_run_composes_it(compose_train, model):
    from ddp_lab.models import load_model_config
    assert load_model_config(model) == compose_train([f"model={model}"]).model
