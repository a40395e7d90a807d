"""model=lenet is the chapter's LeNet: the same layers and the same function."""
import torch
import torch.nn.functional as F

from ddp_lab.models import num_parameters
from ddp_lab.models.lenet import lenet


def chapter_lenet(X, params):
    """The chapter's from-scratch LeNet, as written there (weights as (in, out) matrices)."""
    h1 = F.avg_pool2d(F.relu(F.conv2d(X, params[0], params[1])), kernel_size=(2, 2), stride=(2, 2))
    h2 = F.avg_pool2d(F.relu(F.conv2d(h1, params[2], params[3])), kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(torch.mm(h2, params[4]) + params[5])
    return torch.mm(h3, params[6]) + params[7]


def test_lenet_has_the_chapters_layers_and_parameter_count():
    net = lenet()
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (128, 800), (128,), (10, 128), (10,)]
    assert num_parameters(net) == 129_068
    assert list(net.state_dict())[:2] == ["0.weight", "0.bias"]


def test_lenet_computes_the_chapters_function():
    torch.manual_seed(0)
    net = lenet().double()
    w1, b1, w2, b2, w3, b3, w4, b4 = (p.detach() for p in net.parameters())
    params = [w1, b1, w2, b2, w3.T, b3, w4.T, b4]  # the chapter keeps linear weights as (in, out)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(net(x), chapter_lenet(x, params), rtol=1e-12, atol=1e-12)


def test_lenet_takes_no_machine_specific_knobs():
    from inspect import signature
    assert list(signature(lenet).parameters) == ["num_classes", "in_channels", "init", "sync_bn"]
