"""The small GPT: shapes, causality, weight tying, its presets' sizes, its refusals."""
import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.models import build_model, num_parameters
from ddp_lab.models.gpt import gpt


def test_logits_per_position_and_tied_embedding():
    torch.manual_seed(0)
    net = gpt(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)
    out = net(torch.randint(0, 50, (3, 10)))
    assert out.shape == (3, 10, 50)
    assert net.lm_head.weight is net.wte.weight  # one matrix, counted once
    assert num_parameters(net) == sum(p.numel() for n, p in net.named_parameters())


def test_a_position_sees_only_the_tokens_before_it():
    torch.manual_seed(0)
    net = gpt(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32).eval()
    x = torch.randint(0, 50, (1, 12))
    changed = x.clone()
    changed[0, 7] = (x[0, 7] + 1) % 50
    a, b = net(x), net(changed)
    assert torch.equal(a[0, :7], b[0, :7])  # the past does not see the future
    assert not torch.allclose(a[0, 7:], b[0, 7:])


@pytest.mark.parametrize("preset,params", [("gpt", 834_304), ("gpt_small", 10_844_160)])
def test_presets_have_the_documented_sizes(compose_train, preset, params):
    assert num_parameters(build_model(compose_train([f"model={preset}"]).model)) == params


def test_refusals_name_the_key():
    with pytest.raises(ConfigError, match="model.n_embd=30 must be a multiple of model.n_head=4"):
        gpt(n_embd=30, n_head=4)
    net = gpt(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8)
    with pytest.raises(ValueError, match="a sequence of 9 tokens is longer than the model's block_size of 8"):
        net(torch.zeros(1, 9, dtype=torch.long))
