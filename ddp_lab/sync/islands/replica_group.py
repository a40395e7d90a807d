"""sync.fault_tolerance=torchft: each island a torchft replica group, so that a lost island costs the others a
round, not a restart.

Each island is its own torchrun job (its own rendezvous; its default process group is the island's K ranks,
the inner strategy's). The islands find each other through torchft's Lighthouse, and torchft's Manager makes
the across group anew at every quorum: rank j of every island present. A DiLoCo round (sync.every inner steps)
runs as

    quorum    at the round's start: the islands present (those heartbeating to the Lighthouse); an island
              behind them (a restarted one) is healed here from a peer, its whole trainer state as a checkpoint
              holds it, sent over HTTP by the peer's rank of the same number (sharded inside: shard by shard)
    steps     sync.every inner steps, nothing across islands
    exchange  the outer gradient averaged over the islands present (torchft's DYNAMIC rule: the mean of those
              that are there, each island's part of the data counted once)
    commit    every island votes (torchft's should_commit); a round whose exchange failed (an island died
              in it) is not committed anywhere: no outer step, each island keeps its weights, and the next
              round's outer gradient spans both rounds, so nothing the survivors learnt is dropped

A local SGD round (sync=local_sgd) is the same with the weights averaged and kept where the round commits.

Fewer islands than sync.min_islands at a round's start: the round waits for more (a quorum asked again every
half second) up to 10 x sync.island_timeout_s, then the island stops in one line; it never trains rounds that
cannot commit.

The data: island i reads part i of the training set cut for sync.max_islands (its rank j: part i*K+j of
M*K); an absent island's part is skipped while it is away, the others' parts are untouched. What torchft
does not: the trainer's whole state in the heal (the data position, DiLoCo's anchor and outer momentum, the
schedule), an island refused in one line where its config or code differs from the others' (refuse_unlike),
and the membership in summary.json.
"""
from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from ddp_lab.config import ConfigError, RunFailed
from ddp_lab.telemetry import position

log = logging.getLogger("ddp_lab")

ISLAND_ENV = "DDP_LAB_ISLAND"  # this job's island where sync.island is left at -1 (the cluster tool sets it)


def island_index(cfg) -> int:
    """This job's island: sync.island, else $DDP_LAB_ISLAND; refused in one line when neither says."""
    if cfg.island >= 0:
        return int(cfg.island)
    found = os.environ.get(ISLAND_ENV, "")
    if not found.isdigit() or int(found) >= cfg.max_islands:
        raise ConfigError(f"sync.fault_tolerance=torchft: which island is this job? set sync.island (0 .. "
                          f"{cfg.max_islands - 1}) or {ISLAND_ENV}" + (f" (it holds {found!r})" if found else ""))
    return int(found)


def fault_tolerant(cfg) -> bool:
    return getattr(cfg, "fault_tolerance", "none") == "torchft"


def data_part(cfg, env) -> tuple[int, int] | None:
    """(part, parts) of the training set this rank reads under sync.fault_tolerance=torchft (island i's rank j:
    part i*K+j of M*K); None elsewhere (the world's rank of world_size)."""
    if not fault_tolerant(cfg):
        return None
    return island_index(cfg) * env.world_size + env.rank, cfg.max_islands * env.world_size


def island_identity(config: dict, model=None) -> str:
    """What every island present must share, hashed: `config`, the config's hashed part (what a checkpoint must
    match to resume: checkpoint/compat.py's config_subset), and the code that runs it (ddp_lab's files, torch's
    version, the files that define `model`'s modules outside torch and ddp_lab: a user's model, transformers')."""
    from ddp_lab.checkpoint.compat import config_hash
    from ddp_lab.telemetry.provenance import code_version, model_code
    return config_hash({**config, "code": code_version(), "model_code": model_code(model)})[:12]


def refuse_unlike(island: int, replica_ids: list[str]) -> None:
    """The islands of a quorum run one config and one code: each carries its identity in its torchft replica id
    (`<identity>.island<N>:<uuid>`). An island unlike most of them (a tie: unlike the lowest-numbered island's
    side) stops in one line before it exchanges anything; the others go on without it."""
    held: dict[str, list[int]] = {}
    for rid in replica_ids:
        ident, _, n = rid.split(":")[0].rpartition(".island")
        held.setdefault(ident, []).append(int(n) if n.isdigit() else -1)
    if len(held) < 2:
        return
    like = max(held, key=lambda i: (len(held[i]), -min(held[i])))
    mine = next((i for i, ns in held.items() if island in ns), like)
    if mine != like:
        them = ", ".join(map(str, sorted(held[like])))
        raise RunFailed(f"island {island}: its config or code differs from that of island(s) {them} (identity "
                        f"{mine or '-'} against {like or '-'}: a hash of the config's hashed keys, ddp_lab's files, "
                        "torch's version and the model's code): stopping; launch it with their overrides, code and "
                        "torch")


def _forget_the_last_attempt(rank: int) -> None:
    """torchrun's store outlives a restart's workers and still holds the last attempt's Manager address, which
    the island's other ranks would read and wait on (30 s, then fail): rank 0 deletes it before anyone reads."""
    from torchft.manager import MANAGER_ADDR_KEY, REPLICA_ID_KEY
    if rank == 0:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              wait_for_workers=False)
        for k in (MANAGER_ADDR_KEY, REPLICA_ID_KEY):
            store.delete_key(k)
    dist.barrier()  # (the island's own process group)


def _noting_transport(timeout: timedelta):
    """torchft's HTTP transport of a heal's state, noting whether this island asked a peer for it."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Noting(HTTPTransport):
        asked = False

        def recv_checkpoint(self, *args, **kwargs):
            self.asked = True
            return super().recv_checkpoint(*args, **kwargs)
    return Noting(timeout=timeout, num_chunks=0)


class _Checked:
    """torchft's Manager client, each quorum's islands checked alike (refuse_unlike) as the quorum arrives:
    before a heal or an exchange with them."""

    def __init__(self, client, island: int):
        self._client, self._island = client, island

    def _quorum(self, *args, **kwargs):
        quorum = self._client._quorum(*args, **kwargs)
        refuse_unlike(self._island, list(quorum.replica_ids))
        return quorum

    def __getattr__(self, name: str):
        return getattr(self._client, name)


class ReplicaGroup:
    """This island as a torchft replica group (on this rank: its Manager, its across process group)."""

    def __init__(self, cfg, rank: int, ranks: int, quorum_timeout_s: float, identity: str = ""):
        os.environ.setdefault("RUST_LOG", "warn")  # (torchft's Rust side logs every quorum at info)
        for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.WARNING)  # (ours says what changes: membership, heals)
        try:
            from torchft import Manager
            from torchft.process_group import ProcessGroupGloo
        except ImportError:
            raise ConfigError("sync.fault_tolerance=torchft needs torchft: pip install torchft (or pip install -e "
                              "'.[ft]')") from None
        self.island = island_index(cfg)
        lighthouse = cfg.lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE", "")
        if not lighthouse:
            raise ConfigError("sync.fault_tolerance=torchft: where is the Lighthouse? set sync.lighthouse=http://HOST:"
                              "PORT or TORCHFT_LIGHTHOUSE (start one with: torchft_lighthouse --min_replicas 1)")
        timeout = timedelta(seconds=cfg.island_timeout_s)
        self.pg = ProcessGroupGloo(timeout=timeout)
        self.transport = _noting_transport(timeout)
        if ranks > 1:
            _forget_the_last_attempt(rank)
        try:
            self.manager = Manager(pg=self.pg, load_state_dict=None, state_dict=None, min_replica_size=cfg.min_islands,
                                   use_async_quorum=False,  # (a joiner is healed before its first step)
                                   timeout=timeout, quorum_timeout=timedelta(seconds=quorum_timeout_s),
                                   connect_timeout=timeout, rank=rank, world_size=ranks, lighthouse_addr=lighthouse,
                                   # (every island builds the same weights from the seed: no transfer at step 0)
                                   replica_id=f"{identity}.island{self.island}", init_sync=False,
                                   checkpoint_transport=self.transport)
        except RuntimeError as e:  # (rank 0's connection to the Lighthouse; the others wait for rank 0's server)
            why = str(e).split(";")[0]
            raise ConfigError(f"sync.fault_tolerance=torchft: no Lighthouse answers at {lighthouse} ({why}): start "
                              f"one (torchft_lighthouse --min_replicas 1) or fix sync.lighthouse") from None
        # (torchft 0.2's Manager asks its quorums through _client, a private attribute: no public hook sees them)
        self.manager._client = _Checked(self.manager._client, self.island)
        self.planned, self.waits_s, self.fewest = cfg.max_islands, cfg.island_timeout_s, cfg.min_islands
        self.enough_within_s = quorum_timeout_s  # (fewer than sync.min_islands: how long a round waits for more)
        # the timeouts that end torchft's waits first (the watchdog's dist.timeout_s comes after them): an
        # exchange and its vote; a round's start (more islands, one quorum, a heal)
        self.exchange_s = 2 * cfg.island_timeout_s
        self.quorum_s = 2 * quorum_timeout_s + cfg.island_timeout_s
        self.present = 0  # islands in the last quorum
        self.membership: list[dict] = []  # {"step", "islands"} at every change (summary.json)
        self.rounds_dropped = 0  # rounds not committed (an island lost in them)
        self.healed: dict | None = None  # what the last heal took: {"step": the trainer's, "seconds"}
        self.asked_at = 0.0  # when this island last asked for a quorum

    def join(self, send: Callable[[], dict], take: Callable[[dict], None], step: int) -> dict | None:
        """The first quorum, before this island's first step: a restarted island (behind the others) takes a
        peer's state here (`take`); `send` is what this island gives a joiner. A launch not behind anyone (a
        fresh start, or the whole job resumed from its checkpoints) waits for the islands planned, up to
        sync.island_timeout_s, then goes on with those present (a late one joins from a peer). A quorum or heal
        that failed (the peer ended as it sent) is asked again up to then, and after that the island stops: it
        never trains on from a state behind the others'. Returns the heal, or None."""
        def taken(state: dict) -> None:
            take(state)
            self.healed = {"step": state["shared"]["step"], "seconds": time.perf_counter() - self.asked_at}
        self.manager.register_state_dict_fn("ddp_lab", taken, send)
        self.asked_at = time.perf_counter()  # (a heal's time: the wait for the others' round, the transfer)
        healed, why = self.start_round(step, noted=False), None
        deadline = time.monotonic() + self.waits_s
        while healed is None and time.monotonic() < deadline:
            failed = self.manager.errored()
            if failed is None and self.present >= self.planned:
                break
            why = why or (failed and str(getattr(failed, "original_exception", failed)).splitlines()[0][:200])
            time.sleep(0.2)
            healed = self.start_round(step, noted=False)
        if healed is None and self.transport.asked:  # (behind the others: a peer began to send, and failed)
            raise RunFailed(f"island {self.island}: behind the others, it was not healed from a peer ({why}): "
                            "stopping rather than train on from its own checkpoint (started again while the others "
                            "run, it asks once more)")
        at = step if healed is None else healed["step"]
        self.membership.append({"step": at, "islands": self.present})
        log.info("islands present: %d of the %d planned at step %d%s", self.present, self.planned, at,
                 "" if healed is None else "; this one healed from a peer")
        if self.present < self.planned:
            log.warning("islands present: %d of the %d planned; the others join from a peer when they come",
                        self.present, self.planned)
        return healed

    def start_round(self, step: int, noted: bool = True) -> dict | None:
        """The quorum at a round's start (healing this island if it is behind, waiting while fewer than
        sync.min_islands are present); a change of membership noted."""
        self.healed, before = None, self.present
        if noted:
            self.asked_at = time.perf_counter()
        deadline, warned = time.monotonic() + self.enough_within_s, False
        with position.collective("quorum of islands", own_timeout_s=self.quorum_s):
            self.manager.start_quorum()
            while (n := self.manager.num_participants()) < self.fewest:
                if time.monotonic() > deadline:
                    raise RunFailed(f"island {self.island}: {n} island(s) present at step {step}, fewer than "
                                    f"sync.min_islands={self.fewest}, for {self.enough_within_s:g} s: stopping (its "
                                    "newest checkpoint resumes it; start the lost islands again, or lower "
                                    "sync.min_islands)")
                if not warned:
                    log.warning("islands present: %d at step %d, fewer than sync.min_islands=%d: waiting up to %g s "
                                "for more", n, step, self.fewest, self.enough_within_s)
                    warned = True
                time.sleep(0.5)
                self.manager.start_quorum()
        self.present = n
        if noted and n != before:
            log.info("islands present: %d at step %d (were %d)", n, step, before)
            self.membership.append({"step": step, "islands": n})
        return self.healed

    def state_dict(self) -> dict:
        """The rounds committed (torchft's step: an island with fewer is behind, and is healed), checkpointed so
        that a job resumed whole starts every island level."""
        return {"rounds_committed": self.manager.current_step()}

    def load_state_dict(self, state: dict) -> None:
        if "rounds_committed" in state:
            self.manager.load_state_dict({"step": int(state["rounds_committed"]),
                                          "batches_committed": self.manager.batches_committed()})

    def mean(self, flat, divided_first: bool = False):
        """flat <- its mean over the islands present, under way (torchft's Work: wait() returns False where the
        exchange failed; the round then does not commit). divided_first: by the islands present, then summed
        (torchft's own mean sums first, which 16 bits could overflow)."""
        if not divided_first:
            return self.manager.allreduce(flat)
        return self.manager.allreduce(flat.div_(self.manager.num_participants()), reduce_op=dist.ReduceOp.SUM)

    def commit(self, step: int, what: str = "round") -> bool:
        """Whether every island present may take this round's outer step, or (ft_ddp) this step (all exchanged,
        enough islands)."""
        ok = self.manager.should_commit()
        if not ok:
            self.rounds_dropped += 1
            log.warning("%s ending at step %d not committed (an island was lost in its exchange, or fewer than "
                        "sync.min_islands are present): %s", what, step,
                        "no outer step; this island keeps its weights" if what == "round" else "its gradients are "
                        "dropped, the weights stay")
        return ok

    def close(self) -> None:
        self.manager.shutdown(wait=False)
