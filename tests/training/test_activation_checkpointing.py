"""trainer.activation_checkpointing: fewer saved tensors, the same gradients, and the estimate counts it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddp_lab.config import ConfigError
from ddp_lab.models.gpt import gpt
from ddp_lab.sync.sharded.units import unit_modules
from ddp_lab.training import activation_checkpointing
from ddp_lab.training.memory_estimate import activation_bytes
from ddp_lab.training.tasks import LANGUAGE_MODEL
from tests.sync.user_model import UserTransformer


def test_the_key_takes_none_units_and_every_k_and_refuses_the_rest():
    assert [activation_checkpointing.parse(v) for v in ("none", "units", "every_1", "every_3")] == [0, 1, 1, 3]
    for bad in ("every_0", "every", "blocks"):
        with pytest.raises(ConfigError, match=rf"^trainer.activation_checkpointing={bad} is not one of none, units, "
                                              r"every_<k> \(e.g. every_2: every second unit\)$"):
            activation_checkpointing.parse(bad)


def _saved_and_grads(how: str):
    torch.manual_seed(0)
    model = UserTransformer(n_layer=4, d=32, frozen="none")
    chosen = activation_checkpointing.apply(model, how)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    tokens = torch.randint(0, 16, (4, 9), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model({"tokens": tokens[:, :-1]})
    F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return len(chosen), saved[0], {n: p.grad.clone() for n, p in model.named_parameters()}, model


def test_checkpointed_units_save_less_and_give_the_same_gradients():
    n0, none, ref, _ = _saved_and_grads("none")
    n1, units, every, model = _saved_and_grads("units")
    n2, half, _, _ = _saved_and_grads("every_2")
    assert (n0, n1, n2) == (0, 4, 2)
    assert units < half < none, (units, half, none)
    assert all(torch.equal(every[k], ref[k]) for k in ref)  # the recompute is the same forward
    assert list(model.state_dict()) == list(UserTransformer(n_layer=4, d=32).state_dict())  # names unchanged


def test_the_estimate_counts_inputs_and_one_recompute():
    with torch.device("meta"):
        net = gpt(vocab_size=64, block_size=32, n_layer=4, n_head=2, n_embd=64)
    ids = torch.zeros(32, dtype=torch.long)
    whole = activation_bytes(net, ids, ids, LANGUAGE_MODEL)
    blocks = unit_modules(net)
    each = activation_bytes(net, ids, ids, LANGUAGE_MODEL, blocks)
    one = activation_bytes(net, ids, ids, LANGUAGE_MODEL, blocks[:1])
    # 4 blocks checkpointed keep their inputs and one block's activations: 0.34 of the whole here; one block
    # alone saves nothing on this count (its recompute holds what it saved, the others' all held meanwhile)
    assert each < 0.4 * whole and whole <= one < whole * 1.05, (each, one, whole)


def test_under_bf16_autocast_the_estimate_counts_what_autocast_saves():
    """The meta device has no autocast: the bf16 count runs on fake CPU tensors (no memory)."""
    def net():
        with torch.device("meta"):
            return gpt(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=256)
    ids = torch.zeros(256, dtype=torch.long)

    def count(batch, **autocast):
        return activation_bytes(net(), ids, ids, LANGUAGE_MODEL, batch=batch, **autocast)
    fp32, bf16 = count(9) - count(1), count(9, autocast=torch.bfloat16) - count(1, autocast=torch.bfloat16)
    # a sample: the matmuls' inputs and outputs in bf16, the norms', softmax's and the loss's in fp32
    assert 0.5 * fp32 < bf16 < 0.8 * fp32, (bf16, fp32)
    # once, whatever the batch: the bf16 casts of the 2 blocks' Linear weights (12 x 256 x 256) and of the
    # tied embedding the head multiplies by (256 x 256); a few kB beside (the loss's scalars among them)
    once = count(1, autocast=torch.bfloat16) - bf16 / 8
    assert 0 <= once - 2 * (2 * 12 * 256 * 256 + 256 * 256) < 4096, once
