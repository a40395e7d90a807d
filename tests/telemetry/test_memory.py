"""The model state a rank holds, counted from storages: each once, views adding nothing."""
import math

import pytest
import torch
import torch.nn.functional as F

from ddp_lab.models import build_model, num_parameters
from ddp_lab.models.gpt import gpt
from ddp_lab.models.lenet import lenet
from ddp_lab.sync.every_step.flat import Bucket
from ddp_lab.telemetry.memory import model_state_bytes
from tests.conftest import fit_alone


def _step(model, opt, x, y):
    F.cross_entropy(model(x), y).backward()
    opt.step()


def test_adamw_in_fp32_holds_16_bytes_a_parameter():
    torch.manual_seed(0)
    model = lenet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = num_parameters(model)
    assert model_state_bytes(model, opt) == {"weights": 4 * n, "grads": 0, "optimizer": 0, "sync": 0, "total": 4 * n}
    _step(model, opt, torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]))
    assert model_state_bytes(model, opt) == {"weights": 4 * n, "grads": 4 * n, "optimizer": 8 * n, "sync": 0,
                                              "total": 16 * n}


def test_a_tied_weight_and_gradient_views_count_once():
    torch.manual_seed(0)
    model = gpt(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16)  # embedding tied to the output
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)  # parameters() yields a tied weight once
    bucket = Bucket(params)
    bucket.attach()  # every .grad a view into one buffer
    tokens = torch.randint(0, 16, (2, 9))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    opt.step()
    got = model_state_bytes(model, opt)
    assert got == {"weights": 4 * n, "grads": 4 * n, "optimizer": 4 * n, "sync": 0, "total": 12 * n}


def test_a_run_reports_every_rank_model_state_and_peak(compose_train, tiny_fmnist, tmp_path):
    summary = fit_alone(compose_train, tiny_fmnist, tmp_path / "run", ["trainer.max_steps=2", "optim=adamw"])
    n = num_parameters(build_model(compose_train().model))
    assert summary["model_state_bytes"] == [16 * n]
    assert len(summary["peak_mem_mb_by_rank"]) == 1 and summary["peak_mem_mb_by_rank"][0] > 0
    assert math.isclose(summary["peak_mem_mb_by_rank"][0], summary["peak_mem_mb"], rel_tol=0.05)
    # the data held as tensors, no DataLoader: no worker, none priced
    assert summary["loader_workers_mb_by_rank"] == summary["predicted_workers_mb_by_rank"] == [0.0]


def test_a_run_reports_its_dataloader_workers_memory_beside_their_price(compose_train, tiny_fmnist, tmp_path):
    from ddp_lab.training.memory_estimate import WORKER_BYTES
    summary = fit_alone(compose_train, tiny_fmnist, tmp_path / "run",
                        ["trainer.max_steps=2", "data.loader=dataloader", "data.num_workers=1"])
    assert summary["predicted_workers_mb_by_rank"] == [2 * WORKER_BYTES / 2**20]  # (training's and evaluation's)
    assert 0 < summary["loader_workers_mb_by_rank"][0] < 2 * WORKER_BYTES / 2**20


# DiLoCo's state beside the model and optimizer: the estimate's copies against what a rank holds after a round
DILOCO = {"plain": {"every": 2}, "overlap eager int4": {"every": 2, "overlap": 1, "overlap_update": "eager",
                                                        "compress": "int4", "rounding": "feedback"}}


def _diloco_state(rank: int, world_size: int) -> dict:
    from ddp_lab.distributed import DistEnv
    from ddp_lab.sync import build_sync
    from tests.sync import sync_cfg
    env, out = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), {}
    for name, keys in DILOCO.items():
        torch.manual_seed(0)
        model = lenet()
        sync = build_sync(sync_cfg("diloco", **keys), model, env)
        opt = torch.optim.SGD(sync.parameters(), lr=0.1)
        for step in (1, 2, 3, 4):  # two rounds: the outer momentum made by the first outer step, and under
            # overlap the second round's outer gradient in flight
            _step(sync.module, opt, torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,)))
            sync.after_backward()
            sync.after_step(step)
        out[name] = model_state_bytes(model, opt, sync)["sync"]
    return out


def test_diloco_state_is_counted_and_estimated():
    from ddp_lab.training.memory_estimate import sync_state_bytes
    from tests.multiproc import run_in_processes
    from tests.sync import sync_cfg
    held = run_in_processes(_diloco_state, 2, timeout=120)
    weights = 4 * num_parameters(lenet())
    # the anchor and the outer momentum: two copies exactly
    plain = sync_state_bytes(sync_cfg("diloco", **DILOCO["plain"]), weights, 1)
    assert held[0]["plain"] == held[1]["plain"] == 2 * weights == plain
    # and the outer gradient in flight, its proxy anchor, feedback's residuals (the mean's is a chunk, 1/2 at 2
    # ranks: counted whole)
    estimated = sync_state_bytes(sync_cfg("diloco", **DILOCO["overlap eager int4"]), weights, 1)
    assert estimated == 6 * weights
    assert held[0]["overlap eager int4"] == pytest.approx(5.5 * weights, rel=1e-3)  # (int4's blocks: padded)
    assert held[0]["overlap eager int4"] <= estimated
