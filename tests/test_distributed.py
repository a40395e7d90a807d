"""Process-group setup (ddp_lab/distributed.py): a world of one without torchrun,
and the helpers every rank calls. The opt-in machine tuning on top is tested in tests/tuning/test_tuning.py."""
import pytest
import torch

from ddp_lab import distributed
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from tests.multiproc import run_in_processes

CPU = torch.device("cpu")


def test_without_torchrun_a_world_of_one_and_no_tuning(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    env = distributed.setup("auto", "cpu", 60)
    assert env == DistEnv(0, 1, 0, CPU, "none")
    assert not env.distributed and env.is_main
    assert (env.comm_threads, env.poll) == ("normal", False)  # nothing tuned
    distributed.teardown()  # no group: nothing to do, no error


def test_nccl_on_cpu_is_refused():
    with pytest.raises(ConfigError, match="dist.backend=nccl needs CUDA devices"):
        distributed.resolve_backend("nccl", CPU)


def _helpers(rank, world_size):
    env = DistEnv(rank, world_size, 0, CPU, "gloo")
    t = distributed.all_reduce_sum(torch.tensor([rank + 1.0]), env)
    return t.item(), distributed.all_agree(True, env), distributed.all_agree(rank != 1, env)


def test_all_reduce_sum_and_all_agree_across_ranks():
    assert run_in_processes(_helpers, 3) == [(6.0, True, False)] * 3
    alone = DistEnv(0, 1, 0, CPU, "none")
    assert distributed.all_reduce_sum(torch.tensor([2.0]), alone).item() == 2.0
    assert distributed.all_agree(False, alone) is False
