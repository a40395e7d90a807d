"""What a Trainer's checkpoint holds and takes back: the sharded optimizer state of sync=zero."""
from types import SimpleNamespace

import pytest

from ddp_lab.checkpoint.state import own_state, restore
from ddp_lab.config import ConfigError
from ddp_lab.sync.base import Capabilities
from ddp_lab.training.builder import Progress


class _Optimizer:
    def __init__(self, state):
        self.state, self.loaded = state, None

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


def _sharded_parts():
    """The parts (training/builder.py's Parts) that a checkpoint asks, at rank 2 of 4 under a sharded sync."""
    import torch
    meter = SimpleNamespace(own_state_dict=lambda: {"sums": torch.zeros(3)})
    sync = SimpleNamespace(caps=Capabilities(shards=True), own_state_dict=lambda: {}, shards_over=4)
    env = SimpleNamespace(device=torch.device("cpu"), world_size=4)
    return SimpleNamespace(sync=sync, meter=meter, env=env, progress=Progress(100, 4, step=9, batches_done=1),
                           optimizer=_Optimizer({"state": {0: "rank 2's shard"}}))


def test_each_rank_saves_its_own_shard_of_the_optimizer_state():
    own = own_state(_sharded_parts())
    assert own["optimizer"] == {"state": {0: "rank 2's shard"}} and "model" not in own
    assert (own["step"], own["batches_done"]) == (9, 1)


def test_a_sharded_checkpoint_is_refused_at_another_world_size():
    tr = _sharded_parts()
    # what reshard.py hands a rank at another world size: its RNG and sums, no optimizer shard
    with pytest.raises(ConfigError, match=r"^this checkpoint holds the optimizer state in 4 shards, which this run "
                                          r"cannot cut again: resume it at 4 ranks$"):
        restore(tr, {"world_size": 4}, {"rng": None, "sums": None})
    assert tr.optimizer.loaded is None  # refused before anything was loaded
