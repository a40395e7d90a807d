"""sync.fault_tolerance=torchft (ddp_lab/sync/islands/replica_group.py): islands as torchft replica groups.

The system tests run a Lighthouse and islands, each its own torchrun job; one island's rank is killed
mid-run and torchrun starts it again: the others go on without a restart, the killed one rejoins from a
peer (no checkpoint read), and all end with the same weights; then the whole job resumes from its
checkpoints and ends alike again. The rest: a round's wait for sync.min_islands, and the refusals, each one
line.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from ddp_lab.config import ConfigError, RunFailed
from ddp_lab.sync import check
from ddp_lab.sync.islands.replica_group import (
    ReplicaGroup,
    _Checked,
    data_part,
    island_identity,
    refuse_unlike,
)
from ddp_lab.sync.periodic.periodic_options import DiLoCoOptions, FTDDPOptions, LocalSGDOptions
from tests.conftest import free_port

torchft = pytest.importorskip("torchft")

FT = dict(islands="host", fault_tolerance="torchft", max_islands=3)


@pytest.mark.parametrize("change, says", [
    (dict(islands="none"), "set sync.islands=host"),
    (dict(islands="2"), "set sync.islands=host"),
    (dict(max_islands=0), "set sync.max_islands to their number"),
    (dict(min_islands=4), "sync.min_islands=4 is more than sync.max_islands=3"),
    (dict(island=3), "sync.island=3 is not one of the 3 islands planned"),
    (dict(compress="int4"), "sync.compress=int4 is not made fault tolerant (int8/int4 travel by all-to-all and "
                            "all-gather); use sync.compress=bf16, fp16 or none"),
    (dict(fragments=2, every=4, overlap=2), "one exchange travels at a time, and sync.overlap=2 leaves one under way "
                                            "at the next fragment's send (2 steps later at sync.every=4, "
                                            "sync.fragments=2): use sync.overlap below 2, or fewer fragments"),
    (dict(options=LocalSGDOptions, local_sgd_start_step=4), "sync.local_sgd_start_step=4 averages gradients over"),
    (dict(options=FTDDPOptions, every=2), "sync=ft_ddp averages the gradients every step"),
    (dict(options=FTDDPOptions, fault_tolerance="none"), "sync=ft_ddp is DDP across torchft islands"),
])
def test_what_torchft_islands_cannot_run_is_refused_in_one_line(change, says):
    options = change.pop("options", DiLoCoOptions)
    with pytest.raises(ConfigError, match=re.escape(says)) as e:
        check(options(**{**FT, **change}))
    assert "\n" not in str(e.value)


def test_each_island_reads_its_own_part_of_the_data(monkeypatch):
    env = type("Env", (), {"rank": 1, "world_size": 2})()
    assert data_part(DiLoCoOptions(**FT, island=2), env) == (5, 6)  # island 2's rank 1 of 3 islands x 2 ranks
    monkeypatch.setenv("DDP_LAB_ISLAND", "1")
    assert data_part(DiLoCoOptions(**FT), env) == (3, 6)
    assert data_part(DiLoCoOptions(), env) is None  # not torchft: the world's rank
    monkeypatch.delenv("DDP_LAB_ISLAND")
    with pytest.raises(ConfigError, match="which island is this job"):
        data_part(DiLoCoOptions(**FT), env)


def test_no_lighthouse_is_refused_in_one_line(monkeypatch):
    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # (torchrun's)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="where is the Lighthouse"):
        ReplicaGroup(DiLoCoOptions(**FT, island=0), 0, 1, 10)
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"no Lighthouse answers at {re.escape(dead)}") as e:
        ReplicaGroup(DiLoCoOptions(**FT, island=0, lighthouse=dead, island_timeout_s=1), 0, 1, 10)
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 10
    del store


class _Quorums:
    """A Manager whose quorums hold these many islands, one after another (the last one repeated), the first
    `failing` of them failed (a heal whose peer ended as it sent)."""

    def __init__(self, *counts: int, failing: int = 0):
        self.counts, self.asked, self.failing = counts, 0, failing

    def start_quorum(self) -> None:
        self.asked += 1

    def num_participants(self) -> int:
        return self.counts[min(self.asked, len(self.counts)) - 1]

    def errored(self):
        return RuntimeError("both buffer length (0) and count (-1) must not be 0") if self.asked <= self.failing \
            else None

    def register_state_dict_fn(self, *_) -> None:
        pass


def _group(manager: _Quorums, fewest: int = 1, within_s: float = 30, asked: bool = False) -> ReplicaGroup:
    g = object.__new__(ReplicaGroup)  # (no Lighthouse: the quorums above)
    g.manager, g.fewest, g.enough_within_s, g.island, g.planned, g.waits_s = manager, fewest, within_s, 2, 3, 0.5
    g.present, g.membership, g.healed, g.asked_at, g.quorum_s = 3, [], None, 0.0, 60.0
    g.transport = type("Transport", (), {"asked": asked})()  # (whether a peer was asked for its state)
    return g


def test_an_island_behind_whose_heal_failed_stops_rather_than_train_on_alone():
    g = _group(_Quorums(3, 1, failing=1), asked=True)  # (the others ended as they sent; then it is alone)
    with pytest.raises(RunFailed, match=r"^island 2: behind the others, it was not healed from a peer \(both buffer "
                                        r"length \(0\) and count \(-1\) must not be 0\): stopping rather than train "
                                        r"on from its own checkpoint \(started again while the others run, it asks "
                                        r"once more\)$"):
        g.join(dict, print, 192)
    assert g.manager.asked > 2  # (asked again for sync.island_timeout_s)
    g = _group(_Quorums(3, 3, failing=1))  # a fresh start's failed first quorum (no heal asked): asked again
    assert g.join(dict, print, 0) is None and g.manager.asked == 2 and g.membership == [{"step": 0, "islands": 3}]


def test_a_round_with_fewer_than_min_islands_waits_for_more(caplog):
    g = _group(_Quorums(1, 1, 2), fewest=2)
    assert g.start_round(16) is None
    assert g.manager.asked == 3 and g.present == 2 and g.membership == [{"step": 16, "islands": 2}]
    assert "islands present: 1 at step 16, fewer than sync.min_islands=2: waiting up to 30 s for more" in caplog.text
    g = _group(_Quorums(1))  # (the default, sync.min_islands=1: one island goes on alone)
    g.start_round(24)
    assert g.manager.asked == 1 and g.membership == [{"step": 24, "islands": 1}]


def test_fewer_than_min_islands_for_too_long_stops_in_one_line():
    g = _group(_Quorums(1), fewest=2, within_s=0.6)
    with pytest.raises(RunFailed, match=r"^island 2: 1 island\(s\) present at step 16, fewer than sync.min_islands=2, "
                                        r"for 0.6 s: stopping \(its newest checkpoint resumes it; start the lost "
                                        r"islands again, or lower sync.min_islands\)$"):
        g.start_round(16)
    assert g.manager.asked == 3  # (asked again every half second)


def test_a_local_sgd_round_an_island_was_lost_in_leaves_each_islands_weights_as_they_were():

    from ddp_lab.sync.periodic.local_sgd import LocalSGDSync
    s = object.__new__(LocalSGDSync)  # (its exchange and vote stood in for: the weights' fate is the point)
    w = [torch.ones(3), torch.full((2,), 5.0)]
    s._trained, s.floating_buffers, s.step, votes = (lambda: w), [], 8, []
    s._average = lambda flat: flat.mul_(0.5)  # (the islands' mean, as far as the exchange got)
    s.replicas = SimpleNamespace(commit=lambda step: votes.append(step) or False)
    s.synchronise()
    assert votes == [8] and w[0].tolist() == [1.0] * 3 and w[1].tolist() == [5.0] * 2
    s.replicas = SimpleNamespace(commit=lambda step: True)
    s.synchronise()
    assert w[0].tolist() == [0.5] * 3 and w[1].tolist() == [2.5] * 2


def test_an_eager_round_an_island_was_lost_in_undoes_its_proxy_step_and_keeps_the_steps_since():
    """sync.overlap_update=eager across torchft islands: the proxy's outer step was taken before the vote; a round
    not agreed leaves the anchor, and each island goes on from it with its inner steps since the send."""
    from ddp_lab.sync.periodic.diloco import DiLoCoSync
    from ddp_lab.sync.periodic.in_flight import InFlight
    s = object.__new__(DiLoCoSync)  # (its exchange and vote stood in for)
    w, anchor = torch.tensor([0.7, 1.7]), [torch.tensor([1.0, 2.0])]  # the proxy's anchor 0.8, 1.8; 0.1 down since
    s._trained, s.anchor, s.fragments, s.buffers, s.paper_proxy = (lambda: [w]), anchor, [(0, 1)], [], False
    mean = torch.tensor([0.5, 0.5])  # (what the exchange got to; never applied)
    s.sent = [InFlight(SimpleNamespace(wait=lambda: None), mean, torch.tensor([0.2, 0.2]), 8,
                       proxy=torch.tensor([0.8, 1.8]))]
    votes = []
    s.replicas = SimpleNamespace(commit=lambda step: votes.append(step) or False)
    s._land(0, 0.8)
    assert votes == [8] and s.sent == [None] and anchor[0].tolist() == [1.0, 2.0]
    assert torch.allclose(w, torch.tensor([0.9, 1.9]))  # (the anchor, and the 0.1 of the steps since)


def test_torchft_islands_meet_where_each_exchange_has_landed():
    """Not at a send: so no exchange is under way when torchft remakes its process group for a new membership."""
    from ddp_lab.sync.periodic.diloco import DiLoCoSync

    def met(overlap: int, fragments: int) -> list[int]:
        s = SimpleNamespace(overlap=overlap, every=4, fragments=[(i, i + 1) for i in range(fragments)])
        s.due = lambda f, step: DiLoCoSync.due(s, f, step)
        return [step for step in range(1, 13) if DiLoCoSync.quorum_due(s, step)]
    assert met(0, 1) == [4, 8, 12]  # blocking rounds: at each round's end (the next one's start)
    assert met(2, 1) == [6, 10]  # the outer gradient sent at 4 and 8 lands 2 steps later
    assert met(1, 2) == [3, 5, 7, 9, 11]  # fragments sent at 2 and 4 (0) of each 4, landing a step later


def test_a_16_bit_mean_across_torchft_islands_is_divided_before_it_is_summed():
    """torchft's own mean sums, then divides: 3 islands' fp16 60,000s would overflow (65,504 at most)."""
    calls = []
    manager = SimpleNamespace(num_participants=lambda: 3,
                              allreduce=lambda t, reduce_op=None: calls.append((t.tolist(), str(reduce_op))) or t)
    g = object.__new__(ReplicaGroup)
    g.manager = manager
    g.mean(torch.full((2,), 60000.0, dtype=torch.float16), divided_first=True)
    g.mean(torch.ones(2))  # (fp32: torchft's mean as it is)
    assert calls == [([20000.0, 20000.0], str(torch.distributed.ReduceOp.SUM)), ([1.0, 1.0], "None")]
    from ddp_lab.sync.islands import layout
    sent = []
    islands = SimpleNamespace(sharded_inside=False, size=1, member=0, count=3, inside=None,
                              replicas=SimpleNamespace(mean=lambda t, divided_first: sent.append(
                                  (t.dtype, divided_first)) or SimpleNamespace(wait=lambda: None)))
    for dtype in (torch.float16, torch.bfloat16, None):
        layout.start_island_mean(torch.ones(4), islands, "x", dtype)
    assert sent == [(torch.float16, True), (torch.bfloat16, True), (torch.float32, False)]


def test_an_ft_ddp_step_an_island_was_lost_in_keeps_each_islands_batchnorm_statistics():
    """Not agreed: the gradients are dropped (no optimizer step), and each island's BatchNorm statistics stay its
    own rather than a mean the exchange may not have finished; agreed: both take the mean."""
    from ddp_lab.sync.periodic.ft_ddp import FTDDPSync
    s = object.__new__(FTDDPSync)  # (its exchange and vote stood in for)
    p, stats = torch.nn.Parameter(torch.ones(2)), torch.full((3,), 4.0)
    s.stepped, s.buffers, s.step, s.wire_bytes_across = (lambda: [p]), [stats], 5, 0
    s.count, s._timed = (lambda *a, **k: None), contextlib.nullcontext
    for agreed, grad, kept in ((False, [0.5, 0.5], [4.0] * 3), (True, [0.5, 0.5], [2.0] * 3)):
        p.grad = torch.ones(2)
        s.replicas = SimpleNamespace(mean=lambda flat: SimpleNamespace(wait=lambda: flat.mul_(0.5)), exchange_s=1.0,
                                     commit=lambda step, what, agreed=agreed: agreed)
        s.after_backward()
        assert s.agreed() is agreed and p.grad.tolist() == grad and stats.tolist() == kept


def test_an_island_unlike_the_others_stops_in_one_line_and_they_go_on():
    ids = ["7a1.island0:u0", "7a1.island1:u1", "c3f.island2:u2"]  # (as torchft's quorum lists them)
    for island in (0, 1):
        refuse_unlike(island, ids)
    with pytest.raises(RunFailed, match=r"^island 2: its config or code differs from that of island\(s\) 0, 1 "
                                        r"\(identity c3f against 7a1: a hash of the config's hashed keys, ddp_lab's "
                                        r"files, torch's version and the model's code\): stopping; launch it with "
                                        r"their overrides, code and torch$"):
        refuse_unlike(2, ids)
    ids = ["c3f.island1:u1", "7a1.island0:u0"]  # a tie: the side of the lowest-numbered island stays
    refuse_unlike(0, ids)
    with pytest.raises(RunFailed, match=r"^island 1: .* of island\(s\) 0 \(identity c3f against 7a1"):
        refuse_unlike(1, ids)
    refuse_unlike(1, ["c3f.island1:u1", "c3f.island0:u0", "c3f.island2:u2"])  # all alike

    class Client:  # (torchft's Manager client: the check rides on its quorum, before a heal or an exchange)
        port = 29

        def _quorum(self, **_):
            return type("Quorum", (), {"replica_ids": ids})()
    with pytest.raises(RunFailed, match="^island 1: "):
        _Checked(Client(), 1)._quorum(step=0)
    assert _Checked(Client(), 0)._quorum(step=0).replica_ids == ids and _Checked(Client(), 0).port == 29


def test_the_identity_holds_the_config_that_must_match_and_the_code(compose_train, tmp_path):
    from ddp_lab.telemetry.provenance import code_version
    ft = ["sync=diloco", "sync.islands=host", "sync.fault_tolerance=torchft", "sync.max_islands=2"]
    from ddp_lab.checkpoint import config_subset
    one = island_identity(config_subset(compose_train(ft + ["sync.island=0"])))
    assert island_identity(config_subset(compose_train(ft + ["sync.island=1", "sync.lighthouse=http://x:1"]))) == one
    assert island_identity(config_subset(compose_train(ft + ["sync.island=1", "optim.lr=0.01"]))) != one
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = code_version(tmp_path / "pkg")
    assert before.endswith(f", torch {torch.__version__}") and code_version(tmp_path / "pkg") == before
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path / "pkg") != before


# ------------------------------------------------------------------------------ the system test
def _lighthouse(port: int) -> subprocess.Popen:
    exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    return subprocess.Popen([exe, "--min_replicas", "1", "--join_timeout_ms", "10000", "--heartbeat_timeout_ms",
                             "2000", "--bind", f"[::]:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _islands(tmp_path, data_root, port: int, steps: int, tag: str, extra=(), faults=None, islands: int = 3,
             ranks: int = 1, sync: str = "diloco", own=None, restarts: int = 1) -> list[subprocess.Popen]:
    """Islands, each a torchrun job of `ranks` ranks (torchrun starts a dead rank's island once more); `own`:
    overrides of some islands alone, by island."""
    procs = []
    for i in range(islands):
        env = {**os.environ, "DDP_LAB_FAULT": (faults or {}).get(i, ""), "PYTHONUNBUFFERED": "1"}
        log = open(tmp_path / f"{tag}-{i}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ddp_lab.distributed.torchrun", "--standalone", f"--nproc_per_node={ranks}",
             f"--max-restarts={restarts}", "-m", "ddp_lab.train", f"sync={sync}", "sync.islands=host",
             "sync.fault_tolerance=torchft", f"sync.max_islands={islands}", f"sync.island={i}",
             *(["sync.every=4"] if sync in ("diloco", "local_sgd") else []),
             "sync.island_timeout_s=10", f"sync.lighthouse=http://127.0.0.1:{port}", f"data.root={data_root}",
             f"data.cache_dir={tmp_path / 'cache'}", "data.batch_size=48", "trainer.epochs=100",
             f"trainer.max_steps={steps}", "trainer.eval_every_steps=40", "trainer.ckpt_every_steps=40",
             "trainer.amp=off", "trainer.progress=false", "trainer.warmup_steps=1",
             "trainer.threads=1",  # (an island of one rank would take every core: torchrun sets 1 thread for 2+)
             f"hydra.run.dir={tmp_path / str(i)}",
             *extra, *(own or {}).get(i, ())], stdout=log, stderr=subprocess.STDOUT, env=env))
    return procs


def _ended(procs, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]


@pytest.mark.system
def test_a_killed_island_rejoins_from_a_peer_while_the_others_go_on(tmp_path, tiny_fmnist):
    """Under sync=ft_ddp (a quorum every step); DiLoCo's rounds are the emulated hosts' test
    (tests/tools/cluster/test_islands_torchft.py) and the 2-rank island's below."""
    sync = "ft_ddp"
    port = free_port()
    lighthouse = _lighthouse(port)
    try:
        # island 2's rank is killed after step 6; the others pace their steps so that it is back mid-run
        procs = _islands(tmp_path, tiny_fmnist, port, 80, "run", sync=sync, faults={
            0: "rank=0,step=1,kind=pace=0.15", 1: "rank=0,step=1,kind=pace=0.15", 2: "rank=0,step=6,kind=kill"})
        assert _ended(procs, 240) == [0, 0, 0], [(tmp_path / f"run-{i}.log").read_text()[-2000:] for i in range(3)]
        summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(3)]
        logs = [(tmp_path / f"run-{i}.log").read_text() for i in range(3)]
        for i in (0, 1):  # never restarted (the same torchrun job, its rank started once), one round dropped at most
            assert summaries[i]["restarts_by_rank"] == [0]
            assert summaries[i]["rounds_dropped"] <= 1, logs[i][-2000:]
            present = [m["islands"] for m in summaries[i]["membership"]]
            # (2 while island 2 is away; where its restart reaches the Lighthouse before the lost one's heartbeat
            # times out, the next quorum already heals it and 3 stay: 1 test-all run in several here)
            assert present[0] == 3 and set(present) <= {2, 3} and present[-1] == 3, summaries[i]["membership"]
            assert summaries[i]["steps"] == 80
        assert summaries[2]["restarts_by_rank"] == [1]
        healed = re.search(r"rejoined from a peer island at step (\d+) .*nothing read from disk", logs[2])
        # (killed after step 6 with nothing saved: any later step came from a peer; step 7 where its restart beat
        # the others' wait for it, which then healed it in the step they were held in: once in CI)
        assert healed and 7 <= int(healed.group(1)) < 80, logs[2][-2000:]
        epoch, batch = divmod(int(healed.group(1)), 11)  # the others' data position (171 samples a part, 16 a batch)
        # (after an epoch's last batch: that epoch's batch 11 until the epoch has ended, then its end)
        said = [f"epoch {epoch + 1}, batch {batch}"] if batch else [f"end of epoch {epoch}", f"epoch {epoch}, batch 11"]
        assert any(s in healed.group(0) for s in said), healed.group(0)
        assert "resumed from" not in logs[2]  # (no checkpoint read: its state came from a peer)
        weights = [torch.load(tmp_path / str(i) / "model.pt") for i in range(3)]
        assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])

        # the whole job stopped and started again: each island resumes from its own checkpoint, no heal
        procs = _islands(tmp_path, tiny_fmnist, port, 88, "resume", sync=sync, extra=["trainer.resume=auto"])
        assert _ended(procs, 240) == [0, 0, 0], [(tmp_path / f"resume-{i}.log").read_text()[-2000:] for i in range(3)]
        logs = [(tmp_path / f"resume-{i}.log").read_text() for i in range(3)]
        assert all("resumed from" in t and "step 80" in t and "rejoined" not in t for t in logs)
        weights = [torch.load(tmp_path / str(i) / "model.pt") for i in range(3)]
        assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])
        assert json.loads((tmp_path / "0" / "summary.json").read_text())["steps"] == 88
    finally:
        lighthouse.kill()


@pytest.mark.system
def test_an_island_launched_with_another_config_stops_in_one_line_and_the_other_trains_on(tmp_path, tiny_fmnist):
    """Its identity (config and code, in torchft's replica id) is checked as the first quorum arrives."""
    port = free_port()
    lighthouse = _lighthouse(port)
    try:
        procs = _islands(tmp_path, tiny_fmnist, port, 12, "run", islands=2, own={1: ["optim.lr=0.01"]}, restarts=0)
        assert _ended(procs, 180) == [0, 1]
        log = (tmp_path / "run-1.log").read_text()
        assert re.search(r"ddp_lab: error: island 1: its config or code differs from that of island\(s\) 0 "
                         r"\(identity \w{12} against \w{12}: .*\): stopping; launch it with their overrides, code "
                         r"and torch\n", log), log[-2000:]
        assert json.loads((tmp_path / "0" / "summary.json").read_text())["steps"] == 12
    finally:
        lighthouse.kill()


@pytest.mark.system
@pytest.mark.parametrize("sync,outer", [("diloco", []), ("diloco", ["sync.overlap=2"]), ("ft_ddp", [])],
                         ids=["diloco", "diloco overlap", "ft_ddp"])
def test_an_island_of_two_ranks_restarts_whole_and_heals_shard_by_shard(tmp_path, tiny_fmnist, sync, outer):
    """One rank of a 2-rank island (zero inside: each rank its shard of AdamW's state) dies: torchrun starts the
    island's both ranks again (torchft's unit), each healed from the same rank of the other island; DiLoCo's
    rounds (blocking, or each outer gradient travelling 2 steps, the islands meeting once it landed), and ft_ddp's
    every step (fault-tolerant HSDP)."""
    port = free_port()
    lighthouse = _lighthouse(port)
    try:
        procs = _islands(tmp_path, tiny_fmnist, port, 60, "run", islands=2, ranks=2, sync=sync,
                         extra=["sync/inner=zero", "optim=adamw", "optim.lr=0.001", *outer],
                         # (overlap: killed after step 9, its exchange sent at step 8 still travelling)
                         faults={0: "rank=0,step=1,kind=pace=0.2", 1: f"rank=1,step={9 if outer else 6},kind=kill"})
        assert _ended(procs, 240) == [0, 0], [(tmp_path / f"run-{i}.log").read_text()[-2000:] for i in range(2)]
        summaries = [json.loads((tmp_path / str(i) / "summary.json").read_text()) for i in range(2)]
        assert summaries[0]["restarts_by_rank"] == [0, 0] and summaries[1]["restarts_by_rank"] == [1, 1]
        assert "rejoined from a peer island" in (tmp_path / "run-1.log").read_text()
        weights = [torch.load(tmp_path / str(i) / "model.pt") for i in range(2)]
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    finally:
        lighthouse.kill()


BN_CONV = ["model=custom", "model._target_=tests.workloads.bn_conv"]


@pytest.mark.system
@pytest.mark.parametrize("sync,inside,ranks,plain", [
    ("ft_ddp", [], 1, ["sync=ddp"]),
    ("local_sgd", [], 1, ["sync=local_sgd", "sync.every=4"]),
    ("diloco", BN_CONV, 1, ["sync=diloco", "sync.every=4", *BN_CONV]),  # BatchNorm's statistics averaged
    ("ft_ddp", BN_CONV, 1, ["sync=ddp", *BN_CONV]),  # the statistics averaged across, as DDP's are not
    ("diloco", ["sync.compress=bf16"], 1, ["sync=diloco", "sync.every=4", "sync.compress=bf16"]),  # half the bytes
    # fp16: divided by the islands present before torchft sums (its own mean sums first, which could overflow)
    ("diloco", ["sync.compress=fp16"], 1, ["sync=diloco", "sync.every=4", "sync.compress=fp16"]),
    # the outer gradient travelling 2 steps behind (Streaming DiLoCo's overlap), the islands meeting once it landed
    ("diloco", ["sync.overlap=2"], 1, ["sync=diloco", "sync.every=4", "sync.overlap=2"]),
    # 2 fragments, each exchanged every 4 steps at its own offset and landing a step later, the islands meeting after
    ("diloco", ["sync.fragments=2", "sync.overlap=1"], 1,
     ["sync=diloco", "sync.every=4", "sync.fragments=2", "sync.overlap=1"]),
    ("ft_ddp", ["sync/inner=fsdp"], 2, ["sync=fsdp"]),  # fault-tolerant HSDP: each rank's shard across
    ("ft_ddp", ["sync/inner=zero", "sync.inner.zero_stage=2"], 2, ["sync=zero", "sync.zero_stage=2"]),
], ids=["ft_ddp", "local_sgd", "diloco batchnorm", "ft_ddp batchnorm", "diloco bf16", "diloco fp16",
        "diloco overlap", "diloco fragments", "ft_ddp fsdp inside", "ft_ddp zero2 inside"])
def test_with_every_island_present_torchft_islands_train_as_the_ranks_of_one_job(tmp_path, tiny_fmnist, sync,
                                                                                    inside, ranks, plain):
    """2 islands of `ranks` take the steps of one job's 2 x `ranks` ranks (the same data parts, AdamW): sync=ft_ddp
    DDP's (with fsdp or zero inside, theirs: each rank's shard of the gradients averaged across), local_sgd's
    weights averaged every 4 steps, diloco's rounds with a model's BatchNorm statistics averaged in them."""
    port = free_port()
    lighthouse = _lighthouse(port)
    try:
        procs = _islands(tmp_path, tiny_fmnist, port, 12, "ft", islands=2, sync=sync, ranks=ranks,
                         extra=["optim=adamw", *inside])
        assert _ended(procs, 240) == [0, 0], [(tmp_path / f"ft-{i}.log").read_text()[-2000:] for i in range(2)]
    finally:
        lighthouse.kill()
    ddp = tmp_path / "ddp"
    log = open(tmp_path / "ddp.log", "w")
    rc = subprocess.run(
        [sys.executable, "-m", "ddp_lab.distributed.torchrun", "--standalone", f"--nproc_per_node={2 * ranks}", "-m",
         "ddp_lab.train", *plain, f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path / 'cache'}",
         "data.batch_size=48", "trainer.epochs=100", "trainer.max_steps=12", "trainer.eval_every_steps=40",
         "trainer.ckpt_every_steps=40", "trainer.amp=off", "trainer.progress=false", "trainer.warmup_steps=1",
         "trainer.threads=1",
         "optim=adamw", f"hydra.run.dir={ddp}"], stdout=log, stderr=subprocess.STDOUT, timeout=240).returncode
    assert rc == 0, (tmp_path / "ddp.log").read_text()[-2000:]
    ft, plain = torch.load(tmp_path / "0" / "model.pt"), torch.load(ddp / "model.pt")
    # (ft_ddp's BatchNorm statistics: each island's rank 0's averaged across, where DDP keeps its rank 0's; the
    # weights, trained on batch statistics, are DDP's, and the islands hold the same statistics)
    averaged = sync == "ft_ddp" and inside == BN_CONV
    assert all(torch.allclose(ft[k], plain[k], atol=1e-5, rtol=0) for k in plain if not (averaged and "running" in k))
    if averaged:
        other = torch.load(tmp_path / "1" / "model.pt")
        assert all(torch.equal(ft[k], other[k]) for k in ft)
        assert not torch.equal(ft["1.running_mean"], plain["1.running_mean"])  # (averaged: not DDP's rank 0's)
    s = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert s["steps"] == 12 and s["rounds_dropped"] == 0  # (every step taken: the optimizer stepped 12 times)
    if ranks == 1 and not averaged:  # what crossed between islands is what one job's ranks send (bf16: 2 bytes)
        assert s["wire_bytes_across_per_step"] == json.loads((ddp / "summary.json").read_text())["wire_bytes_per_step"]


def test_the_identity_holds_the_model_code_of_a_users_own_files(tmp_path, monkeypatch):
    """A user's model defined in their own file: islands running two versions of that file are unlike."""
    import importlib

    from ddp_lab.models.gpt import gpt
    from ddp_lab.telemetry.provenance import model_code

    monkeypatch.syspath_prepend(str(tmp_path))
    source = ("import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.body = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n        return self.body(x){}\n")
    codes = []
    for n, tail in enumerate(["", " * 2"]):
        (tmp_path / f"users_net{n}.py").write_text(source.format(tail))
        codes.append(model_code(torch.nn.Sequential(importlib.import_module(f"users_net{n}").Net())))
    assert all(len(c) == 12 for c in codes) and codes[0] != codes[1]
    assert model_code(gpt(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=8)) == ""  # (code_version's)
    assert model_code(torch.nn.Linear(2, 2)) == model_code(None) == ""
    config = {"optim": {"lr": 0.1}}
    mine = island_identity(config, torch.nn.Sequential(importlib.import_module("users_net0").Net()))
    assert mine != island_identity(config, torch.nn.Sequential(importlib.import_module("users_net1").Net()))
    assert mine != island_identity(config) and island_identity(config) == island_identity(config, None)
