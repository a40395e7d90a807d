"""A Hugging Face transformers model, as it is (model=hf_gpt2, model=hf_llama, or model=hf with your own).

    model=hf model.config=gpt2 +model.overrides.n_layer=4      a model type, its configuration changed
    model=hf model.config=/path/to/a/save_pretrained/dir        the configuration a directory holds
    model.pretrained=/path/to/a/save_pretrained/dir             ... and its weights (checkpoint/pretrained.py)

The model is built from its configuration (transformers' AutoModelFor...from_config: its own
initialisation), never downloaded: a directory `save_pretrained` wrote is read from disk. Its forward
takes the data's dict samples by keyword and returns its own loss (ddp_lab.models.calling).
transformers is imported here only, when a run's model is one of its.
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from ddp_lab.config import ConfigError

HEADS = {"causal_lm": "AutoModelForCausalLM", "sequence_classification": "AutoModelForSequenceClassification",
         "masked_lm": "AutoModelForMaskedLM"}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError("model=hf needs the transformers package: pip install 'ddp_lab[hf]'") from None
    return transformers


def load_config(config: str, overrides: dict | None = None):
    """transformers' configuration: `config` a model type (gpt2, llama, ...) or a directory (or its
    config.json) that save_pretrained wrote; `overrides` change its fields."""
    tf, overrides = _transformers(), dict(overrides or {})
    path = Path(str(config)).expanduser()
    if path.name == "config.json":
        path = path.parent
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.config={config} holds no config.json: point it at a directory "
                              f"save_pretrained wrote, or name a model type (gpt2, llama, ...)")
        return tf.AutoConfig.from_pretrained(str(path), **overrides)
    if "/" in str(config) or str(config).startswith("."):
        raise ConfigError(f"model.config={config} does not exist: point it at a directory save_pretrained wrote, "
                          f"or name a model type (gpt2, llama, ...)")
    try:
        return tf.AutoConfig.for_model(str(config), **overrides)
    except ValueError:
        raise ConfigError(f"model.config={config} is neither a directory nor a model type transformers knows "
                          f"(gpt2, llama, bert, ...)") from None


def transformers_model(config: str, head: str = "causal_lm", overrides: dict | None = None) -> nn.Module:
    """The transformers model of `config` (see load_config) with `head`, randomly initialised its own way."""
    if head not in HEADS:
        raise ConfigError(f"model.head={head} is not one of {', '.join(HEADS)}")
    tf = _transformers()
    cfg = load_config(config, overrides)
    auto = getattr(tf, HEADS[head])
    try:
        return auto.from_config(cfg)
    except ValueError as e:  # a configuration without this head (a BERT as a causal LM, say)
        raise ConfigError(f"model.config={config} has no {head} model in transformers: "
                          f"{str(e).splitlines()[0]}") from None


def config_of(model: nn.Module):
    """The transformers configuration a model carries, else None (what an export writes as config.json)."""
    cfg = getattr(model, "config", None)
    return cfg if cfg is not None and hasattr(cfg, "to_json_string") else None
