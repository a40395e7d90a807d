"""Which samples islands train on when one is away and comes back: ddp_lab, whose heal from a peer carries the
data position, against torchft's DistributedSampler in a loop like torchft's example, whose heal carries the
model and the optimizer (the restarted process's loader starts afresh, or from the island's own newest
checkpoint). Indices only, no training: each sampler's own order, step by step, every island.

    python run.py [N PER_ISLAND_BATCH STEPS ISLANDS LOST_ISLAND LOST_AT BACK_AT CKPT_EVERY]
"""
import json
import sys
from collections import Counter

import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset

from ddp_lab.training.data import build_loaders


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, 0


args = [int(a) for a in sys.argv[1:]] or [60000, 128, 800, 3, 2, 200, 400, 50]
n, b, steps, islands, lost_one, lost, back, every = args
ckpt = (lost - 1) // every * every  # the lost island's newest checkpoint


def ddp_lab_batches(island):
    """ddp_lab's loader for this island (part island of islands); batch `position` of the run, as the trainer
    reads it: epoch position // per_epoch, from batch position % per_epoch."""
    data = OmegaConf.create({"batch_size": b * islands, "num_workers": 0, "loader": "torch"})
    train, _ = build_loaders(data, Indices(n), Indices(1), 0, 1, torch.device("cpu"), seed=0, part=(island, islands))
    cache = {}

    def at(position):
        epoch, k = divmod(position, len(train))
        if epoch not in cache:
            cache[epoch] = [x.tolist() for x, _ in train.epoch(epoch)]
        return cache[epoch][k]
    return at


def torchft_batches(island, set_epoch):
    """torchft's DistributedSampler(replica_rank, num_replica_groups) under a DataLoader; the loop's own pass
    count given to set_epoch (or never, as torchft's example)."""
    from torchft.data import DistributedSampler
    from torch.utils.data import DataLoader
    sampler = DistributedSampler(range(n), replica_rank=island, num_replica_groups=islands, group_rank=0,
                                 num_replicas=1, shuffle=True, seed=0)
    per_pass = -(-len(sampler) // b)
    cache = {}

    def at(position):
        p, k = divmod(position, per_pass)
        if p not in cache:
            sampler.set_epoch(p if set_epoch else 0)
            cache[p] = [x.tolist() for x in DataLoader(range(n), batch_size=b, sampler=sampler)]
        return cache[p][k]
    return at, per_pass


def run(regime, loss):
    """Per step, per island: the batch it trains. The lost island trains none while away; back, it goes on at
    the position its heal or its loader gives."""
    trained = []  # (step, sample)
    for island in range(islands):
        if regime == "ddp_lab":
            at, resume = ddp_lab_batches(island), (lambda s: s)  # the peer's position: the step
        else:
            at, _ = torchft_batches(island, set_epoch=regime != "torchft example")
            # a restarted process's loader: afresh, or restored from its own checkpoint at step `ckpt`
            resume = (lambda s: s - back + ckpt) if regime == "torchft, stateful loader" else (lambda s: s - back)
        for s in range(steps):
            away = loss and island == lost_one and lost <= s < back
            if away:
                continue
            position = resume(s) if loss and island == lost_one and s >= back else s
            if loss and island == lost_one and s == back and regime != "ddp_lab":
                continue  # torchft's default async quorum: the healing step's batch is read, its gradient zeroed
            trained += [(s, i) for i in at(position)]
    return trained


def measure(trained, control):
    count, base = Counter(i for _, i in trained), Counter(i for _, i in control)
    per_epoch = -(-(n // islands) // b)  # the run's epochs, by the islands that never left
    windows = Counter((s // per_epoch, i) for s, i in trained)
    return {"samples_trained": len(trained), "never": sum(1 for i in range(n) if count[i] == 0),
            "fewer_than_control": sum(1 for i in range(n) if count[i] < base[i]),
            "more_than_control": sum(1 for i in range(n) if count[i] > base[i]),
            "most_short_of_control": max(base[i] - count[i] for i in range(n)),
            "twice_in_one_epoch": sum(c - 1 for c in windows.values() if c > 1),
            "times_trained": dict(sorted(Counter(count[i] for i in range(n)).items()))}


out = {"args": dict(zip("n per_island_batch steps islands lost_island lost_at back_at ckpt_every".split(), args)),
       "its_newest_checkpoint": ckpt}
for regime in ("ddp_lab", "torchft example", "torchft, set_epoch", "torchft, stateful loader"):
    out[regime] = measure(run(regime, True), run(regime, False))
print(json.dumps(out, indent=1))
