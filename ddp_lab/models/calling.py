"""How a model is called on a batch and how its output is read.

Two kinds of model, told apart by the data:

* a batch of (input, target) pairs: `model(x)` returns the outputs (logits), and the task's loss
  scores them against the targets (ddp_lab's own models, torchvision's);
* a batch of dicts (Hugging Face style: `input_ids`, `attention_mask`, `labels`): `model(**batch)`,
  and the output carries its own loss (`.loss` or `["loss"]`, a transformers ModelOutput or a
  dict) beside its logits (`.logits` or `["logits"]`), which feed the held-out metrics.

A transformers causal LM shifts its labels inside (the logits at t predict label t + 1): its token
metrics are counted so too (`shifts_labels`). Labels of -100 are not counted, as in its loss.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
from torch import nn

from ddp_lab.config import ConfigError

LABELS = "labels"  # the key of the targets in a dict batch, as Hugging Face names it
IGNORE = -100      # a label that is not scored (padding, a prompt), as torch's cross-entropy and transformers


def call(model, x):
    """The model's forward on a batch: keyword arguments for a dict batch, else the input."""
    return model(**x) if isinstance(x, Mapping) else model(x)


def one_batch(sample, device=None):
    """A batch of one from one sample's input (a tensor, or a dict of tensors), on `device`."""
    if isinstance(sample, Mapping):
        return {k: v.unsqueeze(0).to(device) for k, v in sample.items()}
    return sample.unsqueeze(0).to(device)


def to_device(x, device, non_blocking: bool = False):
    if isinstance(x, Mapping):
        return {k: v.to(device, non_blocking=non_blocking) for k, v in x.items()}
    return x.to(device, non_blocking=non_blocking)


def _field(out, name: str):
    if isinstance(out, Mapping):  # (a ModelOutput is one too: its unset fields are not among its keys)
        return out.get(name)
    return getattr(out, name, None)


def loss_and_logits(out) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the output's own loss or None, its logits) of a dict batch's forward; a plain tensor is the logits.
    An output with neither is refused in one line."""
    if isinstance(out, torch.Tensor):
        return None, out
    loss, logits = _field(out, "loss"), _field(out, "logits")
    if loss is None and logits is None:
        what = (f"a {type(out).__name__} with keys {', '.join(map(str, out.keys())) or 'none'}"
                if isinstance(out, Mapping) else f"a {type(out).__name__}")
        raise ConfigError(f"the model's forward returned {what}: ddp_lab needs a loss (.loss or ['loss'], "
                          f"given labels) or logits (.logits or ['logits']), or a tensor of logits")
    return loss, logits


def check_takes_keys(net: nn.Module, keys: list[str], name: str) -> None:
    """A model fed dict batches must name each key as an argument of its forward (a `**kwargs` alone takes any:
    transformers' forwards pass theirs on to attention kernels, so a named forward's is not counted)."""
    params = inspect.signature(net.forward).parameters
    takes = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in keys if k not in takes]
    if unknown and takes:
        raise ConfigError(f"the data's samples are dicts with key(s) {', '.join(unknown)} that model={name}'s "
                          f"forward does not take (it takes {', '.join(takes)}): drop or rename those keys in the "
                          f"data, or set data.input_key and data.target_key to feed it (input, target) pairs")


def shifts_labels(net: nn.Module) -> bool:
    """Whether the model's own loss scores the logits at t against the label at t + 1: a transformers
    causal LM (GPT2LMHeadModel, LlamaForCausalLM, ...). Other models' labels line up with their logits."""
    if not type(net).__module__.startswith("transformers."):
        return bool(getattr(net, "shifts_labels", False))  # (a model of the user's may declare it)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    causal = {n for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
              for n in ([names] if isinstance(names, str) else names)}
    return type(net).__name__ in causal


def aligned(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) paired as the model's loss pairs them: a causal LM's shifted by one."""
    if shift and labels.dim() >= 2:
        return logits[..., :-1, :], labels[..., 1:]
    return logits, labels
