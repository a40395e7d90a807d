"""trainer.amp=fp16 under zero and fsdp: an inf in one rank's shard skips the step on every rank."""
from __future__ import annotations

import torch

from tests.multiproc import run_in_processes


def _step(rank: int, world_size: int, sharded: bool) -> dict:
    import torch.distributed as dist

    from ddp_lab.sync.sharded.grad_scaler import ShardedGradScaler
    assert dist.is_initialized()
    shard = torch.nn.Parameter(torch.ones(4))  # this rank's shard of the weights
    opt = torch.optim.SGD([shard], lr=0.1)
    scaler = (ShardedGradScaler if sharded else torch.amp.GradScaler)("cpu", init_scale=1024.0)
    out = {}
    for step in (1, 2):
        scaler.scale(torch.ones(()))  # (the loss scaled, as a step does: the scale starts there)
        shard.grad = torch.full((4,), scaler.get_scale())  # scaled gradients of 1
        if step == 1 and rank == 1:
            shard.grad[2] = float("inf")  # an overflow in rank 1's shard only
        scaler.step(opt)
        scaler.update()
        out[step] = (shard.detach().clone().tolist(), scaler.get_scale())
    return out


def test_an_overflow_in_one_shard_skips_the_step_on_every_rank():
    ranks = run_in_processes(_step, 2, True)
    for r in ranks:  # step 1 skipped everywhere, the scale halved everywhere; step 2 taken everywhere
        assert r[1] == ([1.0] * 4, 512.0), r
        assert r[2][1] == 512.0 and all(abs(a - 0.9) < 1e-6 for a in r[2][0]), r


def test_torchs_own_scaler_lets_the_ranks_part():
    """The control: the plain scaler steps rank 0 and skips rank 1, their scales then differ."""
    ranks = run_in_processes(_step, 2, False)
    assert ranks[0][1][1] == 1024.0 and ranks[1][1][1] == 512.0
    assert ranks[0][1][0] != ranks[1][1][0]


def _fsdp_step(rank: int, world_size: int) -> dict:
    """fsdp's gradients are DTensors: the scaler finds an inf in rank 1's rows and every rank skips."""
    from ddp_lab.distributed import DistEnv
    from ddp_lab.sync import build_sync
    from ddp_lab.sync.sharded.grad_scaler import ShardedGradScaler
    from tests.sync import sync_cfg
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    sync = build_sync(sync_cfg("fsdp"), model, DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"))
    opt = torch.optim.SGD(sync.param_groups(), lr=0.1)
    scaler = ShardedGradScaler("cpu", init_scale=1024.0)
    before = [p.to_local().clone() for p in model.parameters()]
    scaler.scale(sync.module(torch.ones(2, 4)).sum()).backward()
    if rank == 1:
        next(model.parameters()).grad.to_local()[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    return {"unchanged": all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters())),
            "scale": scaler.get_scale()}


def test_an_overflow_in_one_ranks_rows_of_fsdps_dtensors_skips_every_rank():
    assert run_in_processes(_fsdp_step, 2) == [{"unchanged": True, "scale": 512.0}] * 2
