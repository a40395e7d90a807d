"""sync=flat's buffers: each gradient a view that keeps its parameter's layout."""
from __future__ import annotations

import pytest
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


def test_a_gradient_after_its_buffer_left_is_an_error_not_a_silent_sum():
    bucket = Bucket([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))])
    assert bucket.mark_ready(0) is False and bucket.mark_ready(0) is False  # (twice before it leaves: one)
    assert bucket.mark_ready(1) is True
    with pytest.raises(RuntimeError, match=r"set sync.overlap_backward=false$"):
        bucket.mark_ready(0)
    bucket.reset()
    assert bucket.mark_ready(1) is False


def _overlapped(rank: int, world_size: int, overlap: bool = True) -> dict:
    """Two steps of an MLP in several buffers, each of 2 micro-batches: what is in flight when each backward
    ends, and each step's gradients against the mean of every rank's, computed apart on a copy."""
    import copy

    import torch.distributed as dist

    from ddp_lab.distributed import DistEnv
    from ddp_lab.sync.every_step.flat import FlatSync
    from tests.sync import sync_cfg
    torch.manual_seed(0)
    used = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)], torch.nn.Linear(64, 2))
    unused = torch.nn.Linear(64, 64)  # never called: its buffer leaves after the backward
    model, ref = torch.nn.Sequential(unused, used), copy.deepcopy(used)
    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    sync = FlatSync(model, env, sync_cfg("flat", buffer_mb=64 * 65 * 4 / 2**20,  # about a Linear a buffer
                                         overlap_backward=overlap))
    left_in_backward = sum(not any(p is q for p in b.params for q in unused.parameters()) for b in sync.buckets)
    out = {"buffers": len(sync.buckets), "left_in_backward": left_in_backward, "in_flight": [], "grads_equal": []}
    for step in range(2):
        for i in range(2):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(10 * step + 2 * rank + i))
            with sync.during_backward(last=True) if i == 1 else sync.no_sync():
                used(x).square().mean().backward()
            ref(x).square().mean().backward()
            out["in_flight"].append(len(sync._in_flight))
        sync.after_backward()
        for p, q in zip(used.parameters(), ref.parameters()):
            dist.all_reduce(q.grad)
            out["grads_equal"].append(torch.allclose(p.grad, q.grad / world_size, rtol=1e-6, atol=1e-7))
        model.zero_grad(set_to_none=False)
        ref.zero_grad(set_to_none=True)
    out["unused_grad_zero"] = all(torch.equal(p.grad, torch.zeros_like(p)) for p in unused.parameters())
    return out


def test_overlapped_buffers_leave_in_the_backward_and_average_like_one_all_reduce():
    from tests.multiproc import run_in_processes
    for r in run_in_processes(_overlapped, 2, timeout=60):
        # no_sync's micro-batch sends nothing; the last backward starts every buffer it fills, the unused
        # layer's after it
        n = r["left_in_backward"]
        assert r["buffers"] > n >= 4 and r["in_flight"] == [0, n, 0, n], r
        assert len(r["grads_equal"]) == 20 and all(r["grads_equal"]) and r["unused_grad_zero"], r
    for r in run_in_processes(_overlapped, 2, False, timeout=60):  # sync.overlap_backward=false: all after it
        assert r["in_flight"] == [0, 0, 0, 0] and all(r["grads_equal"]) and r["unused_grad_zero"], r
