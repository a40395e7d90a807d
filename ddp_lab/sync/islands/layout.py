"""sync.islands: which ranks form an island, the two process groups every rank belongs to, and the mean
over islands that the cross-island strategy sends.

Islands are runs of K consecutive ranks (torchrun numbers a host's ranks consecutively: island = host
under sync.islands=host, K = LOCAL_WORLD_SIZE). Every rank is in two groups:

    inside   the K ranks of its island         (the every-step strategy, sync.inner: the fast link)
    across   rank `member` of every island     (the periodic strategy, sync=<name>: the slow link)

torchft's layout: rank j of each island exchanges chunk j of the outer gradient with rank j of the others,
so the slow link carries 1/K of it per pair of ranks, and the island then all-gathers the K mean chunks
over its fast link. 4 ranks as 2 islands of 2: inside {0, 1} and {2, 3}, across {0, 2} and {1, 3}.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import TORCH_ALL_GATHER
from ddp_lab.collectives.quantized import BITS as QUANTIZED
from ddp_lab.collectives.quantized import start_quantized_mean
from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv

ISLANDS_HELP = "ranks in islands: none | host (torchrun's node) | K (runs of K consecutive ranks)"


def islands_spec_ok(v) -> bool:
    return str(v) in ("none", "host") or (str(v).isdigit() and int(v) >= 1)


def island_size(spec: str, world_size: int, local_world_size: int) -> int:
    """K, the ranks an island holds, from sync.islands (host: this host's `local_world_size` | K), refused unless
    it divides the world."""
    if spec == "host":
        k = local_world_size
        where = f"sync.islands=host (LOCAL_WORLD_SIZE={k}, a host's ranks)"
    else:
        k, where = int(spec), f"sync.islands={spec}"
    if k < 1 or world_size % k:
        raise ConfigError(f"{where} does not divide the {world_size} ranks into islands of equal size: use "
                          f"sync.islands=K with K dividing {world_size}, or the same --nproc_per_node on every host")
    return k


@dataclass(frozen=True)
class Islands:
    size: int  # K: ranks an island
    count: int  # islands
    index: int  # this rank's island
    member: int  # this rank's place in it, 0..K-1
    inside: DistEnv  # the K ranks of this island (rank, world_size counted within)
    across: DistEnv  # rank `member` of every island
    # the inner strategy shards the weights (zero stage 3, fsdp): each rank's outer gradient is of its own
    # shard, already 1/K of the island's, so it crosses whole and nothing is gathered inside
    sharded_inside: bool = False
    # sync.fault_tolerance=torchft: this island as a torchft replica group (replica_group.py), whose Manager
    # averages across the islands present; `count` is then the islands planned, `across.group` None
    replicas: object = None

    def describe(self) -> str:
        if self.replicas is not None:
            return f"island {self.index} of {self.count} planned, {self.size} rank(s), torchft"
        return f"{self.count} islands of {self.size}"


def island_shape(spec: str, env: DistEnv) -> tuple[int, int]:
    """(islands, K ranks each) from sync.islands, checked on every rank alike."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))  # (torchrun's: this host's ranks)
    if spec == "host":  # (every rank hears every host's count before any refuses: none is left waiting)
        _same_host_layout(env, local)
    k = island_size(spec, env.world_size, local)
    return env.world_size // k, k


def build_islands(spec: str, env: DistEnv) -> Islands:
    """Every rank makes every group, in the same order (torch's rule for new_group), and gets its two."""
    n, k = island_shape(spec, env)
    insides = [dist.new_group(list(range(i * k, (i + 1) * k))) for i in range(n)]
    acrosses = [dist.new_group(list(range(j, env.world_size, k))) for j in range(k)]
    index, member = divmod(env.rank, k)
    return Islands(k, n, index, member,
                   dataclasses.replace(env, rank=member, world_size=k, group=insides[index]),
                   dataclasses.replace(env, rank=index, world_size=n, group=acrosses[member]))


def replica_islands(cfg, env: DistEnv, replicas) -> Islands:
    """sync.fault_tolerance=torchft: this torchrun job is the island (its default group), the across group is
    torchft's, made anew at every quorum."""
    return Islands(env.world_size, cfg.max_islands, replicas.island, env.rank, env,
                   dataclasses.replace(env, rank=replicas.island, world_size=cfg.max_islands, group=None),
                   replicas=replicas)


def _same_host_layout(env: DistEnv, k: int) -> None:
    """sync.islands=host: every host must run K ranks, numbered consecutively (torchrun's static layout); a
    host with another count (an elastic membership change, uneven --nproc_per_node) is refused on every rank."""
    local = int(os.environ.get("LOCAL_RANK", env.rank % k))
    mine = torch.tensor([k, int(env.rank == env.rank // k * k + local)])
    every = [torch.zeros_like(mine) for _ in range(env.world_size)]
    dist.all_gather(every, mine)
    sizes = sorted({int(t[0]) for t in every})
    if len(sizes) > 1 or not all(int(t[1]) for t in every):
        raise ConfigError(f"sync.islands=host needs every host to run the same number of consecutive ranks; "
                          f"these hosts run {sizes} (LOCAL_WORLD_SIZE): launch the same --nproc_per_node on "
                          f"every host, or use sync.islands=K")


class IslandMean:
    """start_island_mean's exchange under way: advance() (int8, int4: the quantized mean's second half) and
    wait(), after which `flat` holds the mean over islands."""

    def __init__(self, flat, chunk, first, islands: Islands, k: int):
        self.flat, self.chunk, self.first, self.islands, self.k = flat, chunk, first, islands, k

    def advance(self) -> None:
        if self.first is not None and hasattr(self.first, "advance"):
            self.first.advance()

    def wait(self) -> torch.Tensor:
        if self.first is None:  # (waited for before)
            return self.flat
        self.first.wait()
        self.first = None
        k, c = self.k, self.chunk.numel()
        whole = torch.empty(k * c, dtype=torch.float32, device=self.flat.device)
        if k > 1:
            TORCH_ALL_GATHER(whole, self.chunk.float(), group=self.islands.inside.group)
        else:
            whole.copy_(self.chunk)
        return self.flat.copy_(whole[:self.flat.numel()])


def start_island_mean(flat: torch.Tensor, islands: Islands, compress: str, dtype: torch.dtype | None = None,
                      residual=None, generator: torch.Generator | None = None):
    """flat (1-D fp32, the same on every rank of an island) <- its mean over the islands, in the background:
    this rank's chunk all-reduced across (in `dtype`, or int8/int4), the chunks then gathered inside.
    int8, int4 round with `residual` (error feedback) or `generator` (stochastic), as start_quantized_mean.
    Returns (the IslandMean, bytes across, collectives across, bytes inside). (islands.sharded_inside: `flat` is
    this rank's own shard, all of it this rank's chunk.)"""
    k, member = (1, 0) if islands.sharded_inside else (islands.size, islands.member)
    c = -(-flat.numel() // k)
    padded = torch.zeros(k * c, dtype=torch.float32, device=flat.device)
    padded[:flat.numel()] = flat
    mine = padded[member * c:(member + 1) * c]
    if islands.replicas is not None:  # torchft: the mean over the islands present (fp32, bf16, fp16; int8/int4 refused)
        chunk = mine.to(dtype or torch.float32, copy=True)
        first = islands.replicas.mean(chunk, divided_first=chunk.element_size() == 2)  # (16 bits: as below)
        across, calls = chunk.numel() * chunk.element_size(), 1
    elif compress in QUANTIZED:
        chunk = mine.clone()
        first, across = start_quantized_mean(chunk, compress, islands.across.group, residual, generator)
        calls = 2
    else:
        chunk = mine.to(dtype or torch.float32, copy=True).div_(islands.count)  # (divided first: no 16-bit overflow)
        first = dist.all_reduce(chunk, group=islands.across.group, async_op=True)
        across, calls = chunk.numel() * chunk.element_size(), 1
    inside = k * c * 4 if k > 1 else 0
    return IslandMean(flat, chunk, first, islands, k), across, calls, inside
