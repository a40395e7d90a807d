"""A strategy let go is freed at once: DDP's reducer holds our communication hook, and a
hook that held the strategy would keep DDP, its buckets and its process group alive until
the interpreter's exit (a cycle through C++ that gc cannot see)."""
from __future__ import annotations

import gc
import weakref

import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import build_sync
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

CPU = torch.device("cpu")
HOOKS = [("builtin", "none"), ("builtin", "bf16"), ("builtin", "powersgd"), ("ring", "none")]


def _freed_when_dropped(rank: int, world_size: int) -> list[tuple[str, bool, bool]]:
    gc.disable()  # freed by reference counting alone, not by a later collection
    out = []
    for algo, compress in HOOKS:
        # (0.1 MB buckets: LeNet's 0.5 MB of gradients in several)
        cfg = (sync_cfg("powersgd", algo, bucket_cap_mb=0.1, powersgd_rank=2, powersgd_start_step=2)
               if compress == "powersgd" else sync_cfg("ddp", algo, compress, bucket_cap_mb=0.1))
        sync = build_sync(cfg, lenet(), DistEnv(rank, world_size, 0, CPU, "gloo"))
        x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        torch.nn.functional.cross_entropy(sync.module(x), y).backward()  # the hook has run
        counted, ddp = sync.wire_bytes > 0, weakref.ref(sync.module)
        del sync
        out.append((f"{algo}/{compress}", counted, ddp() is None))
    gc.enable()
    return out


def test_a_dropped_ddp_strategy_frees_its_ddp_without_a_collection():
    assert run_in_processes(_freed_when_dropped, 2) == [[(f"{a}/{c}", True, True) for a, c in HOOKS]] * 2


# every strategy but ft_ddp (it needs torchft's Lighthouse); flat over several buffers
STRATEGIES = [("flat", {"buffer_mb": 0.1}), ("zero", {"zero_stage": 1}), ("zero", {"zero_stage": 2}),
          ("zero", {"zero_stage": 3}), ("ddp", {}), ("per_param", {}), ("powersgd", {}), ("local_sgd", {}),
          ("diloco", {}), ("fsdp", {})]


def _model_freed(rank: int, world_size: int) -> list[tuple[str, bool]]:
    out = []
    for mode, keys in STRATEGIES:
        sync = build_sync(sync_cfg(mode, **keys), lenet(), DistEnv(rank, world_size, 0, CPU, "gloo"))
        x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        torch.nn.functional.cross_entropy(sync.module(x), y).backward()
        sync.after_backward()
        weight = weakref.ref(next(sync.module.parameters()))
        del sync
        gc.collect()
        out.append((f"{mode}{keys.get('zero_stage', '')}", weight() is None))
    return out


def test_every_dropped_strategy_lets_its_model_go():
    """A parameter's post-accumulate-grad hooks live in C++, out of gc's sight: a hook holding the strategy, which
    holds the parameters, kept the model, its gradients and buffers alive for good (flat and zero; each job of a
    sweep added its own). Every strategy's model is freed once it is dropped."""
    assert run_in_processes(_model_freed, 2) == [[(f"{m}{k.get('zero_stage', '')}", True) for m, k in STRATEGIES]] * 2
