"""Exact evaluation where every forward is a collective (zero stage 3, fsdp gather the weights in it):
ranks with fewer held-out batches than another run uncounted forwards until they are even."""
import pytest
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import build_sync
from ddp_lab.training.evaluation import evaluate
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

CPU = torch.device("cpu")
BATCHES = {0: 3, 1: 1, 2: 0}  # held-out batches per rank: uneven, one rank with none


class _Batches:
    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def epoch(self, epoch):
        return iter(self.batches)


def _data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(5, 1, 28, 28, generator=g), torch.randint(0, 10, (5,), generator=g)) for _ in range(4)]


def _run(rank: int, world_size: int, mode: str) -> tuple:
    data = _data()
    first = sum(BATCHES[r] for r in range(rank))
    mine = data[first:first + BATCHES[rank]]
    torch.manual_seed(0)
    model = lenet()
    extra = {"zero_stage": 3} if mode == "zero" else {}
    sync = build_sync(sync_cfg(mode, "builtin", **extra), model, DistEnv(rank, world_size, 0, CPU, "gloo"))
    with sync.consensus():
        return evaluate(model, _Batches(mine), DistEnv(rank, world_size, 0, CPU, "gloo"), lockstep=data[0][0][0])


@pytest.mark.parametrize("mode", ["zero", "fsdp"])
def test_uneven_held_out_shards_are_scored_exactly_without_a_hang(mode):
    torch.manual_seed(0)
    whole = evaluate(lenet(), _Batches(_data()), DistEnv(0, 1, 0, CPU, "none"))
    got = run_in_processes(_run, 3, mode, timeout=120)
    assert all(g[1:] == whole[1:] and abs(g[0] - whole[0]) < 1e-4 for g in got), (got, whole)
    assert whole[2] == 20
