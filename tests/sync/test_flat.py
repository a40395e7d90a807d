"""sync=flat's buffers: each gradient a view that keeps its parameter's layout."""
from __future__ import annotations

import torch

from ddp_lab.sync.every_step.flat import Bucket, bucketed, flat_view


def test_bucket_views_keep_the_param_layout_and_survive_set_to_none():
    conv = torch.nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
    bucket = Bucket(list(conv.parameters()))
    bucket.attach()
    assert conv.weight.grad.stride() == conv.weight.stride()  # channels_last, like autograd's
    x = torch.randn(2, 2, 5, 5).contiguous(memory_format=torch.channels_last)
    conv(x).sum().backward()
    expected = [p.grad.clone() for p in conv.parameters()]
    assert torch.equal(bucket.buffer, torch.cat([flat_view(g) for g in expected]))
    conv.zero_grad(set_to_none=True)
    conv(x).sum().backward()  # fresh grads, not views
    bucket.attach()
    for p, view, g in zip(conv.parameters(), bucket.views, expected):
        assert p.grad is view and torch.equal(p.grad, g)


def test_buckets_hold_consecutive_params_of_one_dtype_up_to_the_cap():
    f32 = [torch.nn.Parameter(torch.zeros(n)) for n in (100, 100, 300)]  # 400, 400, 1200 bytes
    f64 = torch.nn.Parameter(torch.zeros(10, dtype=torch.float64))
    def sizes(buckets):
        return [[p.numel() for p in b] for b in buckets]
    assert sizes(bucketed(f32, 0)) == [[100, 100, 300]]          # 0: no cap
    assert sizes(bucketed(f32, 800)) == [[100, 100], [300]]      # a full bucket closes
    assert sizes(bucketed(f32, 500)) == [[100], [100], [300]]    # a param bigger than the cap: its own
    assert sizes(bucketed([f32[0], f64, f32[1]], 0)) == [[100], [10], [100]]  # dtypes never mix


def test_flat_view_is_memory_order_or_none():
    t = torch.arange(24.).view(2, 3, 4)
    assert torch.equal(flat_view(t), torch.arange(24.))
    nhwc = torch.arange(24.).view(1, 2, 3, 4).contiguous(memory_format=torch.channels_last)
    assert torch.equal(flat_view(nhwc), nhwc.permute(0, 2, 3, 1).reshape(-1))
    assert flat_view(t[:, :, :2]) is None  # a slice leaves gaps: not one run of memory
