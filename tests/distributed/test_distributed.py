"""Process-group setup (ddp_lab/distributed/): a world of one without torchrun,
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
    return distributed.all_reduce_sum(torch.tensor([rank + 1.0]), env).item()


def test_all_reduce_sum_across_ranks():
    assert run_in_processes(_helpers, 3) == [6.0] * 3
    alone = DistEnv(0, 1, 0, CPU, "none")
    assert distributed.all_reduce_sum(torch.tensor([2.0]), alone).item() == 2.0


LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("env,message", [
    ({"RANK": "1", "WORLD_SIZE": "1"}, "RANK=1 with WORLD_SIZE=1: a rank must be below the world size (0..0)"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK=2 with WORLD_SIZE=2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 must be an integer >= 0"),
    ({"RANK": "1.5", "WORLD_SIZE": "2"}, "RANK=1.5 must be an integer >= 0"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE=two must be an integer >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be an integer >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x"}, "LOCAL_RANK=x must be an integer >= 0"),
    ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but MASTER_ADDR and MASTER_PORT are not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "WORLD_SIZE=2 but MASTER_PORT is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "p"}, "MASTER_PORT=p must be an integer"),
])
def test_a_launch_environment_that_cannot_be_is_refused_before_joining(monkeypatch, env, message):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        distributed.setup("auto", "cpu", 60)
    assert message in str(e.value)
    assert str(e.value).endswith("launch with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
                                 "and MASTER_PORT (or unset RANK to run one process)")


def test_rank_0_of_a_world_of_one_without_a_store_runs_alone(monkeypatch):
    for k in LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.setup("auto", "cpu", 60) == DistEnv(0, 1, 0, CPU, "none")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert distributed.launch_env() == (0, 1, 0, True)  # with one: a group of one, as torchrun makes
