"""Resuming at another world size: a checkpoint of N ranks continues on M.

What carries over, and what is guaranteed:

* The model, optimizer, LR schedule and grad scaler are rank 0's state.pt:
  data parallelism keeps them identical on every rank, so they fit any M
  (local_sgd's and diloco's ranks, apart between syncs, all continue from
  rank 0's; zero's and fsdp's optimizer state is in shards: the last point).
* The global batch stays `data.batch_size` (hashed with the config); each
  rank takes global / M, and a batch that does not divide over M ranks is
  refused before anything is loaded (ddp_lab.training.data.per_rank_batch names the
  batches and world sizes that would divide).
* The place in the data: DistributedSampler deals one seeded permutation of
  the epoch round-robin over the ranks, so after s optimizer steps of
  B = global batch x grad_accum images the ranks have trained on exactly the
  permutation's first s x B positions, whatever the world size. Resumed at
  step s on M ranks, each rank skips its first s x grad_accum batches: the
  remaining positions are trained on once, none twice. (As in every
  DistributedSampler epoch, the epoch's last batch is padded with up to M-1
  repeats of the permutation's first samples; that padding depends on M.)
* Per-rank state is reconciled, not refused: the partial epoch's running
  sums (loss x images, correct, images) of all N ranks are added and given
  to rank 0 (the epoch's metrics are their sum anyway); a rank that existed
  before gets back its RNG states, a new one starts from a generator seeded
  by (seed, step, rank). At the same world size every rank loads its own
  file, and the resumed run stays bit-identical.

* ZeRO's optimizer state (sync=zero, every stage) is each rank's own
  file: its parameter i is chunk r of a group (stages 1 and 2: a bucket; 3:
  a unit) padded to N chunks, and the groups are the same at any N. Each new
  rank reads every old rank's state, joins each tensor over them, cuts the
  padding off and takes its chunk of the group padded to M
  (reshard_zero_state). fsdp's (DTensors: rank r's rows of each parameter)
  are joined and cut again the same way, by the parameter's rows
  (FSDPSync.reshard_optimizer_state). Where one copy is cut over an island's K
  ranks (sync.inner=zero, HSDP: every island holds the same, or its own, shards)
  the new ranks of each island cut island 0's again (old ranks 0..K-1).

* Sharded weights (zero stage 3, fsdp) are each rank's own file too
  (state.pt holds none of them): zero's a flat piece per unit as above,
  fsdp's each parameter's rows. A new rank takes its rows of each from
  the old ranks that held them (my_rows), and of those ranks' files only
  those rows: every old rank's file is opened with torch.load(mmap=True),
  so a page is read only when sliced, and no rank reads, or holds, what it
  will not own. The optimizer state reshards the same way.

Why not torch.distributed.checkpoint (DCP): DCP writes each rank's shards
with a global plan and reshards on load, what we do here for the only
sharded state there is (1-D pieces of a unit, rows of a parameter), in
my_rows' twenty lines. Its file reader loads every saved chunk a new rank
overlaps whole before narrowing it; the mapped read above reads only the
rows. And our own format keeps what DCP does not give: each file's
checksum in meta.json and one atomic rename per checkpoint.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

from ddp_lab.checkpoint.files import rank_file


def load_own(step_dir: Path, rank: int, world_size: int, saved_world_size: int,
             seed: int, step: int) -> dict:
    """This rank's own state ({"rng", "sums"}) for a run of `world_size` ranks."""
    def read(r: int, mmap: bool = False) -> dict:  # (mapped: only the pages a rank slices are read)
        return torch.load(Path(step_dir) / rank_file(r), map_location="cpu", weights_only=True, mmap=mmap)

    if world_size == saved_world_size:
        return read(rank)
    first = read(0, mmap=True)
    # (zero, fsdp; islands' sync.inner=zero, whose weights are each rank's too) every rank's shards are asked,
    # those of the first `over` ranks: one copy (islands, HSDP: island 0's)
    sharded = "optimizer" in first and ("model" not in first or "shards_over" in first)
    over = first.get("shards_over", saved_world_size)
    everyone = rank == 0 or sharded  # (rank 0 adds every rank's sums)
    saved = {r: first if r == 0 else read(r, mmap=True) for r in range(saved_world_size) if everyone or r == rank}
    sums = torch.zeros(3, dtype=torch.float64)
    if rank == 0:
        for own in saved.values():
            sums += own["sums"]
    rng = saved[rank]["rng"] if rank < saved_world_size else fresh_rng_state(seed, step, rank)
    out = {"rng": rng, "sums": sums}
    if sharded:
        out["optimizers"] = [saved[r]["optimizer"] for r in range(over)]
    if "weights" in first:  # (zero stage 3, fsdp) every old rank's shards of the weights, mapped
        out["all_weights"] = [saved[r]["weights"] for r in range(over)]
    return out


def my_rows(piece_of, rows: int, old_n: int, rank: int, n: int) -> torch.Tensor:
    """Rows [rank*c, (rank+1)*c) (c = ceil(rows/n), cut at `rows`) of a tensor of `rows` rows that `old_n`
    ranks held in chunks of ceil(rows/old_n), old rank q's as piece_of(q) (its own chunk, padding past
    `rows` allowed). Only the old ranks holding some of those rows are asked, and only those rows read:
    from a checkpoint loaded with torch.load(mmap=True), a rank reads no page it will not own."""
    old_c, c = -(-rows // old_n), -(-rows // n)
    lo, hi = min(rank * c, rows), min((rank + 1) * c, rows)
    parts = []
    for q in range(lo // old_c if old_c else 0, old_n):
        start, end = q * old_c, min((q + 1) * old_c, rows)
        if start >= hi:
            break
        if max(start, lo) < min(end, hi):
            parts.append(piece_of(q)[max(start, lo) - start:min(end, hi) - start])
    if not parts:  # a rank past the last row holds none: rank 0's zero rows, for their shape and dtype
        return piece_of(0)[:0]
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def padded(rows: torch.Tensor, length: int) -> torch.Tensor:
    """`rows` (1-D) followed by zeros up to `length` elements: a chunk of a group padded to N chunks."""
    out = torch.zeros(length, dtype=rows.dtype)
    out[:rows.numel()] = rows
    return out


def flat_rows(tensors, lo: int, hi: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Elements [lo, hi) of `tensors` (an iterable) flattened and joined, followed by zeros up to `length`: a rank's
    chunk of a flat group, each tensor read only where the chunk covers it (a mapped one: only those pages)."""
    out, at = torch.zeros(length, dtype=dtype), 0
    for t in tensors:
        a, b = max(lo, at), min(hi, at + t.numel())
        if a < b:
            out[a - lo:b - lo] = t.reshape(-1)[a - at:b - at]
        at += t.numel()
    return out


def stepped(optimizer_state: dict) -> int:
    """How many parameters an optimizer state_dict steps, over all its groups."""
    return sum(len(g["params"]) for g in optimizer_state["param_groups"])


def reshard_zero_state(states: list[dict], sizes: list[int], rank: int, world_size: int) -> dict:
    """This rank's optimizer state_dict at `world_size` from every old rank's (`states`, in rank order;
    loaded with mmap=True, only this rank's elements are read): parameter i of each is a chunk of a
    group of sizes[i] elements padded to N chunks."""
    if any(stepped(s) != len(sizes) for s in states):
        raise ValueError(f"the checkpoint's optimizer steps {stepped(states[0])} shard(s) a rank, "
                         f"this run {len(sizes)}")
    state = {}
    for i, size in enumerate(sizes):
        state[i] = {}
        for key, value in states[0]["state"].get(i, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() == 1:  # a tensor per element: resharded
                rows = my_rows(lambda q, i=i, key=key: states[q]["state"][i][key], size, len(states), rank, world_size)
                state[i][key] = padded(rows, -(-size // world_size))
            else:  # AdamW's step count: the same on every rank
                state[i][key] = unmapped(value)
    return {"state": state, "param_groups": states[0]["param_groups"]}


def unmapped(value):
    """A tensor read from a mapped checkpoint, copied (anything else as it is). Kept as it is, even a scalar holds
    its whole file mapped and every page the rank read from it resident for the rest of the run (torch's optimizer
    keeps AdamW's step tensor as given): a 57M-parameter GPT under stage 3 resumed from 2 ranks on 3 peaked at
    1,399 MiB on rank 0, 1,176 without."""
    return value.clone() if isinstance(value, torch.Tensor) else value


def fresh_rng_state(seed: int, step: int, rank: int) -> dict:
    """RNG states for a rank the checkpoint did not have, the same on every resume."""
    from ddp_lab.checkpoint.rng import rng_state

    derived = (seed * 1_000_003 + step * 1_009 + rank) & 0x7FFF_FFFF
    random.seed(derived)
    torch.manual_seed(derived)
    try:
        import numpy as np
        np.random.seed(derived)
    except ImportError:
        pass
    return rng_state(torch.device("cpu"))
