"""LeNet's unused-border crop and its padded conv1 compute the same function as the plain net."""
import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.models import lenet, live_input_extent


@pytest.mark.parametrize("n, live", [(28, 26), (30, 30), (31, 30), (33, 30), (35, 34), (10, 10)])
def test_live_extent_walks_the_layers(n, live):
    assert live_input_extent(n) == live  # (10: too small for LeNet, left uncropped)


# Sizes whose pooled map is 4x4, the only ones LeNet's 800-input linear layer takes.
@pytest.mark.parametrize("n, live", [(28, 26), (29, 26)])
def test_live_extent_is_exactly_the_part_of_the_input_that_matters(n, live):
    assert live_input_extent(n) == live
    torch.manual_seed(0)
    net = lenet(crop_unused_border=False).double()
    x = torch.randn(2, 1, n, n, dtype=torch.float64)
    base = net(x)
    beyond = x.clone()
    beyond[..., live:, :] += 5.0
    beyond[..., :, live:] += 5.0
    assert torch.equal(net(beyond), base)          # past the extent: no effect at all
    last_row = x.clone()
    last_row[..., live - 1, :] += 5.0
    assert not torch.allclose(net(last_row), base)  # the last live row does matter


def test_cropped_lenet_gives_the_same_logits_and_gradients():
    torch.manual_seed(0)
    full = lenet(crop_unused_border=False).double()
    cropped = lenet(crop_unused_border=True).double()
    cropped.load_state_dict(full.state_dict())
    x = torch.randn(8, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (8,))
    outs = []
    for net in (full, cropped):
        logits = net(x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        outs.append((logits, [p.grad for p in net.parameters()]))
    (l_full, g_full), (l_crop, g_crop) = outs
    torch.testing.assert_close(l_crop, l_full, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_crop, g_full):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_crop_keeps_the_parameter_names_checkpoints_use():
    plain = torch.nn.Sequential(*lenet(crop_unused_border=False))
    assert list(lenet().state_dict()) == list(plain.state_dict())
    assert list(lenet().state_dict())[:2] == ["0.weight", "0.bias"]


def _logits_and_grads(net, x, y, forward=None):
    logits = (forward or net)(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    return logits, [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("pad_to", [32, 16, 7])
def test_padded_conv1_gives_the_same_logits_and_gradients(pad_to):
    torch.manual_seed(0)
    net = lenet(pad_channels_to=pad_to).double()
    x = torch.randn(8, 1, 28, 28, dtype=torch.float64)
    y = torch.randint(0, 10, (8,))
    l_plain, g_plain = _logits_and_grads(net, x, y)
    net.zero_grad()
    l_pad, g_pad = _logits_and_grads(net, x, y, lambda t: net.forward_padded(t[..., :26, :26]))
    torch.testing.assert_close(l_pad, l_plain, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_pad, g_plain):
        assert a.shape == b.shape  # the padding never reaches a parameter
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("channels_last", [True, False])
def test_padded_path_hands_conv2_a_dense_input_in_the_model_layout(channels_last):
    """The padded channels are dropped by a copy, not left as a strided view
    that oneDNN would copy again in conv2's forward and backward."""
    net = lenet()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    seen = []
    conv2 = [m for m in net if isinstance(m, torch.nn.Conv2d)][1]
    conv2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    net.forward_padded(torch.randn(4, 1, 26, 26).to(memory_format=fmt))
    (x,) = seen
    assert x.shape == (4, 20, 12, 12)
    assert x.is_contiguous(memory_format=fmt)


def test_compiled_lenet_takes_the_padded_path_and_eager_does_not(monkeypatch):
    torch.manual_seed(0)
    net = lenet()
    calls = []
    padded = net.forward_padded
    monkeypatch.setattr(net, "forward_padded", lambda x: calls.append(x.shape) or padded(x))
    x = torch.randn(4, 1, 28, 28)
    eager = net(x)
    assert calls == []
    compiled = torch.compile(net, backend="eager")(x)  # dynamo traces forward(), no kernels built
    assert calls == [torch.Size([4, 1, 26, 26])]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_negative_channel_padding_is_refused():
    with pytest.raises(ConfigError, match="model.pad_channels_to=-1"):
        lenet(pad_channels_to=-1)
