"""model=lenet_fast computes model=lenet's function of the same weights: its cropped
border and its padded conv1 change neither the logits nor the gradients (float64)."""
import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.models.lenet import lenet
from ddp_lab.models.lenet_fast import lenet_fast, live_input_extent


@pytest.mark.parametrize("n, live", [(28, 26), (30, 30), (31, 30), (33, 30), (35, 34), (10, 10)])
def test_live_extent_walks_the_layers(n, live):
    assert live_input_extent(n) == live  # (10: too small for LeNet, left uncropped)


# Sizes whose pooled map is 4x4, the only ones LeNet's 800-input linear layer takes.
@pytest.mark.parametrize("n, live", [(28, 26), (29, 26)])
def test_live_extent_is_exactly_the_part_of_the_input_that_matters(n, live):
    assert live_input_extent(n) == live
    torch.manual_seed(0)
    net = lenet().double()
    x = torch.randn(2, 1, n, n, dtype=torch.float64)
    base = net(x)
    beyond = x.clone()
    beyond[..., live:, :] += 5.0
    beyond[..., :, live:] += 5.0
    assert torch.equal(net(beyond), base)          # past the extent: no effect at all
    last_row = x.clone()
    last_row[..., live - 1, :] += 5.0
    assert not torch.allclose(net(last_row), base)  # the last live row does matter


def test_weights_move_between_lenet_and_lenet_fast():
    plain, fast = lenet(), lenet_fast()
    assert list(fast.state_dict()) == list(plain.state_dict())
    fast.load_state_dict(plain.state_dict())  # strict: every key, every shape
    plain.load_state_dict(fast.state_dict())


def _logits_and_grads(net, x, y, forward=None):
    net.zero_grad()
    logits = (forward or net)(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    return logits, [p.grad.clone() for p in net.parameters()]


def _assert_same(got, want):
    (l_got, g_got), (l_want, g_want) = got, want
    torch.testing.assert_close(l_got, l_want, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_got, g_want):
        assert a.shape == b.shape  # the padding never reaches a parameter
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _plain_and_fast(**knobs):
    torch.manual_seed(0)
    plain = lenet().double()
    fast = lenet_fast(**knobs).double()
    fast.load_state_dict(plain.state_dict())
    x = torch.randn(8, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (8,))
    return plain, fast, x, y


def test_cropped_lenet_gives_lenets_logits_and_gradients():
    plain, fast, x, y = _plain_and_fast()
    assert fast.crop_unused_border
    _assert_same(_logits_and_grads(fast, x, y), _logits_and_grads(plain, x, y))


@pytest.mark.parametrize("pad_to", [32, 16, 7])
def test_padded_conv1_gives_lenets_logits_and_gradients(pad_to):
    plain, fast, x, y = _plain_and_fast(pad_channels_to=pad_to)
    padded = _logits_and_grads(fast, x, y, lambda t: fast.forward_padded(t[..., :26, :26]))
    _assert_same(padded, _logits_and_grads(plain, x, y))


def test_knobs_off_is_lenet_computed_the_same_way():
    plain, fast, x, y = _plain_and_fast(crop_unused_border=False, pad_channels_to=0)
    (l_fast, g_fast), (l_plain, g_plain) = _logits_and_grads(fast, x, y), _logits_and_grads(plain, x, y)
    assert torch.equal(l_fast, l_plain)
    assert all(torch.equal(a, b) for a, b in zip(g_fast, g_plain))


@pytest.mark.parametrize("channels_last", [True, False])
def test_padded_path_hands_conv2_a_dense_input_in_the_model_layout(channels_last):
    """The padded channels are dropped by a copy, not left as a strided view
    that oneDNN would copy again in conv2's forward and backward."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = lenet_fast().to(memory_format=fmt)
    seen = []
    conv2 = [m for m in net if isinstance(m, torch.nn.Conv2d)][1]
    conv2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    net.forward_padded(torch.randn(4, 1, 26, 26).to(memory_format=fmt))
    (x,) = seen
    assert x.shape == (4, 20, 12, 12)
    assert x.is_contiguous(memory_format=fmt)


def test_only_compiled_bf16_lenet_fast_takes_the_padded_path(monkeypatch):
    torch.manual_seed(0)
    net = lenet_fast()
    calls = []
    padded = net.forward_padded
    monkeypatch.setattr(net, "forward_padded", lambda x: calls.append(x.shape) or padded(x))
    x = torch.randn(4, 1, 28, 28)
    compiled = torch.compile(net, backend="eager", fullgraph=True)  # dynamo traces, builds no kernels
    with torch.autocast("cpu", torch.bfloat16):
        eager = net(x)
        assert calls == []  # eager: the 20 channels as they are
        out = compiled(x)
        assert calls == [torch.Size([4, 1, 26, 26])]
    torch.testing.assert_close(out, eager, rtol=1e-2, atol=1e-2)  # bf16 rounding
    compiled(x)  # float32, compiled: traced again, not padded
    assert len(calls) == 1
    torch.testing.assert_close(compiled(x), net(x), rtol=1e-5, atol=1e-6)


def test_negative_channel_padding_is_refused():
    with pytest.raises(ConfigError, match="model.pad_channels_to=-1"):
        lenet_fast(pad_channels_to=-1)
