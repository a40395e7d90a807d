"""MFU's parts: model FLOPs as torch's FLOP counter finds them, checked against a hand
count; the measured, cached matmul peak; the ratio.

What torch counts (torch.utils.flop_counter), and so what the hand counts below count:
- a convolution, forward: 2 * Cin * Cout * k * k * Hout * Wout per image (a
  multiply-add is 2 FLOPs); a linear layer: 2 * in * out. Bias additions, ReLU,
  pooling, BatchNorm, the loss and the optimizer: 0.
- backward: the weight's gradient costs as much as the forward, and so does the
  input's gradient, which autograd computes only where the input needs one. The
  first layer's input is the data, which needs none: the first layer's backward is
  1x its forward, every other layer's 2x.
"""
import json
import math

import pytest
import torch

from ddp_lab.models.lenet import lenet
from ddp_lab.models.lenet_fast import lenet_fast
from ddp_lab.models.resnet import resnet18
from ddp_lab.telemetry import mfu as mfu_module
from ddp_lab.telemetry.mfu import mfu, peak_flops, peak_for_run, train_flops_per_image


def conv(c_in, c_out, k, h_out, w_out=None):
    return 2 * c_in * c_out * k * k * h_out * (w_out or h_out)


def linear(n_in, n_out):
    return 2 * n_in * n_out


def train_count(first_layer, later_layers):
    """forward + backward: the first layer's input needs no gradient, the others' do."""
    return first_layer * 2 + sum(later_layers) * 3


def test_lenet_flops_are_the_hand_count():
    # 28 -> conv3 -> 26 -> pool -> 13 -> conv5 -> 9 -> pool -> 4 (x 50 channels = 800)
    first = conv(1, 20, 3, 26)                                              # 243,360
    later = [conv(20, 50, 5, 9), linear(800, 128), linear(128, 10)]         # 4,257,360
    assert train_count(first, later) == 13_258_800
    assert train_flops_per_image(lenet(), (1, 28, 28)) == 13_258_800


def test_lenet_fast_counts_its_cropped_arithmetic():
    # the input cropped to 26x26: conv1 computes 24x24, conv2 8x8
    first = conv(1, 20, 3, 24)
    later = [conv(20, 50, 5, 8), linear(800, 128), linear(128, 10)]
    assert train_count(first, later) == 10_636_800
    assert train_flops_per_image(lenet_fast(), (1, 28, 28)) == 10_636_800


def test_resnet18_flops_are_the_hand_count():
    # 3x3 stem at 28x28 (padding 1), stages at 28, 14, 7 and 4 pixels; each later
    # stage opens with a stride-2 3x3 conv and a stride-2 1x1 downsample; fc 512 -> 10.
    first = conv(1, 64, 3, 28)
    later = [conv(64, 64, 3, 28)] * 4
    for c_in, c_out, side in ((64, 128, 14), (128, 256, 7), (256, 512, 4)):
        later += [conv(c_in, c_out, 3, side), conv(c_in, c_out, 1, side)]
        later += [conv(c_out, c_out, 3, side)] * 3
    later.append(linear(512, 10))
    assert first + sum(later) == 911_601_664  # forward
    assert train_count(first, later) == 2_733_901_824
    assert train_flops_per_image(resnet18(), (1, 28, 28)) == 2_733_901_824


def test_counting_leaves_the_model_as_it_was():
    net = resnet18()
    net.train()
    net[1].eval()  # modes are restored per module
    before = {k: v.clone() for k, v in net.state_dict().items()}
    train_flops_per_image(net, (1, 28, 28), torch.bfloat16)
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # BN statistics too
    assert net.training and not net[1].training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in net.parameters())


def test_compiled_model_is_counted_as_the_bare_one():
    net = lenet()
    assert train_flops_per_image(torch.compile(net), (1, 28, 28)) == 13_258_800


# ---------------------------------------------------------------- peak


def test_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(mfu_module, "WARMUP_S", 0.25)  # 2 s in real use
    cache = tmp_path / "peak_flops.json"
    peak = peak_flops("cpu", torch.float32, threads=1, size=64, repeats=2, cache_path=cache)
    assert peak > 0 and math.isfinite(peak)
    (key, entry), = json.loads(cache.read_text()).items()
    assert "threads=1" in key and key.endswith("|float32")
    assert entry["flops_per_sec"] == peak and entry["size"] == 64 and entry["threads"] == 1
    assert entry["flops_per_sec"] == pytest.approx(2 * 64 ** 3 / min(entry["seconds"]))
    assert "best of 2 torch.matmul of two 64x64 matrices after 0.25 s of warm-up" in entry["method"]

    def no_measuring(*args):
        raise AssertionError("measured again instead of reading the cache")
    monkeypatch.setattr(mfu_module, "measure_matmul", no_measuring)
    assert peak_flops("cpu", torch.float32, threads=1, size=64, cache_path=cache) == peak
    with pytest.raises(AssertionError, match="measured again"):  # another dtype: another entry
        peak_flops("cpu", torch.bfloat16, threads=1, size=64, cache_path=cache)


def test_peak_measures_again_at_another_size_and_keeps_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(mfu_module, "WARMUP_S", 0.0)  # one untimed call still runs
    cache = tmp_path / "peak_flops.json"
    threads = torch.get_num_threads()
    peak_flops("cpu", torch.float32, threads=1, size=32, repeats=1, cache_path=cache)
    peak_flops("cpu", torch.float32, threads=1, size=48, repeats=1, cache_path=cache)
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["size"] == 48
    assert torch.get_num_threads() == threads  # the caller's thread count is restored


def test_default_cache_is_looked_up_at_the_call(tmp_path, monkeypatch):
    monkeypatch.delenv("DDP_LAB_PEAK_CACHE")
    monkeypatch.setattr(mfu_module, "WARMUP_S", 0.0)
    monkeypatch.setattr(mfu_module, "DEFAULT_CACHE", tmp_path / "elsewhere.json")
    peak_flops("cpu", torch.float32, threads=1, size=32, repeats=1)
    assert "threads=1" in next(iter(json.loads((tmp_path / "elsewhere.json").read_text())))
    monkeypatch.setenv("DDP_LAB_PEAK_CACHE", str(tmp_path / "from_env.json"))  # what tests set
    peak_flops("cpu", torch.float32, threads=1, size=32, repeats=1)
    assert (tmp_path / "from_env.json").is_file()


def test_automatic_size_grows_until_a_call_takes_long_enough(monkeypatch):
    cpu = torch.device("cpu")
    # a pretend matmul whose time grows as size^3: 0.1 s at 1024
    monkeypatch.setattr(mfu_module, "_timed_matmul", lambda a, b, out: 0.1 * (a.shape[0] / 1024) ** 3)
    monkeypatch.setattr(mfu_module, "WARMUP_S", 0.0)
    monkeypatch.setattr(mfu_module, "TIMED_S", 5.0)  # as in real use (the test session cuts it)
    entry = mfu_module.measure_matmul(cpu, torch.float32, 1, repeats=4)
    assert entry["size"] == 1024 and entry["requested_size"] is None and entry["repeats"] == 4
    assert entry["flops_per_sec"] == pytest.approx(2 * 1024 ** 3 / 0.1)
    assert "size doubled from 256 until a call took 0.1 s, at most 2048" in entry["method"]
    monkeypatch.setattr(mfu_module, "_timed_matmul", lambda a, b, out: 1e-4)  # fast at every size
    assert mfu_module.measure_matmul(cpu, torch.float32, 1, repeats=4)["size"] == 2048
    monkeypatch.setattr(mfu_module, "TIMED_S", 0.0)  # out of time: 3 timed calls all the same
    assert mfu_module.measure_matmul(cpu, torch.float32, 1, size=64, repeats=10)["repeats"] == 3


def test_measuring_the_peak_draws_nothing_from_the_runs_generator(monkeypatch):
    """Else a run's dropout masks would depend on whether the peak was cached (a transformers model's 0.1)."""
    monkeypatch.setattr(mfu_module, "WARMUP_S", 0.0)
    monkeypatch.setattr(mfu_module, "TIMED_S", 0.0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    mfu_module.measure_matmul(torch.device("cpu"), torch.float32, 1, size=64, repeats=3)
    assert torch.equal(torch.get_rng_state(), before)


def test_run_peak_counts_the_cores_the_ranks_use(monkeypatch):
    asked = []
    monkeypatch.setattr(mfu_module, "peak_flops",
                        lambda device, dtype, threads=None, **kw: asked.append(threads) or 10.0)
    monkeypatch.setattr(mfu_module.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert peak_for_run("cpu", torch.float32, 2, 2, 1) == 10.0  # 2 ranks x 1 thread, one machine
    assert peak_for_run("cpu", torch.float32, 8, 4, 2) == 20.0  # 4 x 2 threads, capped at 4 cores; 2 machines
    assert asked == [2, 4]
    assert peak_for_run("cuda", torch.bfloat16, 8, 4, 1) == 80.0  # one GPU's peak per rank


def test_mfu_is_model_flops_per_second_over_the_peak():
    assert mfu(13_258_800, 2_000, 1e11) == pytest.approx(0.265176)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="peak FLOP rate must be a positive finite number"):
            mfu(1.0, 1.0, bad)
