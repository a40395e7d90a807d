"""A checkpoint of N ranks resumes on M: the same global batch, every remaining sample once."""
import pytest
import torch

from ddp_lab import checkpoint
from ddp_lab.checkpoint.reshard import load_own
from ddp_lab.training.data import build_datasets, build_loaders
from tests.conftest import read_summary, run_module, tiny_overrides

CPU = torch.device("cpu")




def _indices(cfg, world_size, epoch, start, stop=None):
    """Sample indices (not labels) the ranks take from batch `start` to `stop`."""
    out = []
    for rank in range(world_size):
        train, _ = build_loaders(cfg, *build_datasets(cfg), rank, world_size, CPU, seed=0)
        train.sampler.set_epoch(epoch)
        order = list(train.sampler)
        b = train.batch_size
        out += order[start * b: None if stop is None else stop * b]
    return out


@pytest.mark.parametrize("before,after", [(4, 2), (2, 3), (3, 4)])
def test_the_remaining_samples_of_the_epoch_are_trained_on_once(compose_train, tiny_fmnist,
                                                                 tmp_path, before, after):
    cfg = compose_train([f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}",
                         "data.batch_size=96"]).data  # divides over 2, 3 and 4 ranks
    n, steps_done = 512, 2
    trained = _indices(cfg, before, epoch=1, start=0, stop=steps_done)
    rest = _indices(cfg, after, epoch=1, start=steps_done)
    assert len(trained) == steps_done * 96 and len(set(trained)) == len(trained)
    # every sample of the epoch exactly once, but for DistributedSampler's own padding of
    # the epoch's last batch: (-n) % after repeats of the permutation's first samples
    padding = -n % after
    assert set(trained) | set(rest) == set(range(n))
    assert len(rest) == n - steps_done * 96 + padding
    assert len(set(trained) & set(rest)) + len(rest) - len(set(rest)) == padding


def _rank_files_of(world_size, tmp_path):
    """The rank files of a checkpoint of `world_size` ranks, with distinct sums per rank."""
    root = tmp_path / "ck"
    root.mkdir()
    for rank in range(world_size):
        torch.manual_seed(rank)
        own = {"rng": checkpoint.rng_state(CPU),
               "sums": torch.tensor([1.0 + rank, 2.0 * rank, 10.0], dtype=torch.float64)}
        torch.save(own, root / checkpoint.rank_file(rank))
    return root


def test_per_rank_state_is_reconciled(tmp_path):
    step_dir = _rank_files_of(4, tmp_path)
    two = [load_own(step_dir, r, world_size=2, saved_world_size=4, seed=0, step=9) for r in (0, 1)]
    # the partial epoch's sums of all 4 ranks go to rank 0: their total is unchanged
    assert two[0]["sums"].tolist() == [1 + 2 + 3 + 4, 0 + 2 + 4 + 6, 40.0]
    assert two[1]["sums"].tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(two[1]["rng"]["torch"], torch.load(step_dir / "rank1.pt")["rng"]["torch"])
    # growing: a new rank gets RNG states derived from (seed, step, rank), the same every time
    six = [load_own(step_dir, r, world_size=6, saved_world_size=4, seed=0, step=9) for r in range(6)]
    again = load_own(step_dir, 5, world_size=6, saved_world_size=4, seed=0, step=9)
    assert torch.equal(six[5]["rng"]["torch"], again["rng"]["torch"])
    assert not torch.equal(six[4]["rng"]["torch"], six[5]["rng"]["torch"])
    assert sum(s["sums"][2].item() for s in six) == 40.0
    # the same world size: each rank its own file, as written
    same = load_own(step_dir, 2, world_size=4, saved_world_size=4, seed=0, step=9)
    assert same["sums"].tolist() == [3.0, 4.0, 10.0]


@pytest.mark.system
@pytest.mark.parametrize("sync,before,after", [
    (["sync=diloco", "sync.every=3"], 2, 3), (["sync=powersgd", "sync.powersgd_start_step=2"], 2, 3),
    # 2 islands of 2, stage 3 inside, finished as 1 island of 2 (another island count): island 0's shards of
    # the weights cut again, the anchor starting from them
    (["sync=diloco", "sync.every=3", "sync.islands=2", "sync/inner=zero", "sync.inner.zero_stage=3"], 4, 2)],
    ids=["diloco", "powersgd", "islands_zero3"])
def test_per_rank_sync_state_is_reconciled_by_the_rule(tiny_fmnist, tmp_path, sync, before, after):
    """Stopped at step 8 on 2 ranks (DiLoCo between synchronisations, PowerSGD with error
    feedback under way), finished on 3: rank 0's weights for all, no error feedback."""
    args = tiny_overrides(tiny_fmnist, tmp_path / "run") + [
        "data.batch_size=96", "trainer.amp=off", "optim.schedule=constant", *sync]
    part = run_module("ddp_lab.train", args + ["trainer.max_steps=8"], nproc=before)
    assert part.returncode == 0, part.stderr[-3000:]
    rest = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=after)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert f"on {after} ranks, written by {before}" in rest.stdout
    logs = "".join((tmp_path / "run" / f"rank{r}.log").read_text() for r in range(after))
    assert logs.count("resumed at another world size: every rank continues from rank 0's weights") == after
    s = read_summary(tmp_path / "run")
    assert s["world_sizes"] == [[0, before], [8, after]] and s["steps"] == 12
    assert s["test_acc"] > 0.3  # learned: three times chance (DiLoCo every 3 learns slowest in 12 steps)


def _zero_states(values: torch.Tensor, world_size: int) -> list[dict]:
    """Every rank's AdamW state_dict under zero: one group, chunk r of `values` padded to N chunks."""
    chunk = -(-values.numel() // world_size)
    padded = torch.cat([values, torch.zeros(chunk * world_size - values.numel())])
    return [{"state": {0: {"step": torch.tensor(5.0), "exp_avg": padded[r * chunk:(r + 1) * chunk].clone(),
                           "exp_avg_sq": 2 * padded[r * chunk:(r + 1) * chunk]}},
             "param_groups": [{"lr": 0.1, "params": [0]}]} for r in range(world_size)]


@pytest.mark.parametrize("before,after", [(4, 3), (3, 4), (2, 5)])
def test_zero_optimizer_shards_are_cut_again_for_another_world_size(before, after):
    from ddp_lab.checkpoint.reshard import reshard_zero_state
    values = torch.arange(1.0, 11.0)  # a group of 10 elements: padded to 12 (4 and 3 ranks), 10 (2, 5)
    new = [reshard_zero_state(_zero_states(values, before), [10], r, after) for r in range(after)]
    for got, want in zip(new, _zero_states(values, after)):  # what a run at `after` ranks holds
        assert torch.equal(got["state"][0]["exp_avg"], want["state"][0]["exp_avg"])
        assert torch.equal(got["state"][0]["exp_avg_sq"], want["state"][0]["exp_avg_sq"])
        assert got["state"][0]["step"].item() == 5.0 and got["param_groups"] == want["param_groups"]
    with pytest.raises(ValueError, match=r"the checkpoint's optimizer steps 1 shard\(s\) a rank, this run 2"):
        reshard_zero_state(_zero_states(values, before), [6, 4], 0, after)


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_a_ranks_chunk_of_a_flat_group_is_cut_from_its_tensors_elements(world_size):
    from ddp_lab.checkpoint.reshard import flat_rows
    tensors = [torch.arange(6.0).view(2, 3), torch.arange(10.0, 14.0), torch.arange(20.0, 21.0)]  # 11 elements
    whole = torch.cat([t.reshape(-1) for t in tensors])
    chunk = -(-whole.numel() // world_size)
    padded = torch.cat([whole, torch.zeros(chunk * world_size - whole.numel())])
    for r in range(world_size):  # (the last rank's chunk padded with zeros)
        got = flat_rows(iter(tensors), r * chunk, min((r + 1) * chunk, whole.numel()), chunk, torch.float32)
        assert torch.equal(got, padded[r * chunk:(r + 1) * chunk])
    assert flat_rows(iter(tensors), 8, 11, 4, torch.float64).tolist() == [12.0, 13.0, 20.0, 0.0]


@pytest.mark.system
def test_zero_stage_three_and_fsdp_runs_stopped_on_3_ranks_finish_on_2_as_an_unsharded_one(tiny_fmnist, tmp_path):
    """SGD's momentum sharded 3 ways (ours: flat chunks of each unit, padded; FSDP2: uneven rows of each
    parameter, as DTensors), resharded 2 ways, ends where sync=flat (every rank the whole state, rank 0's
    loaded) stopped and resumed the same way ends: within the sums' order, where a lost momentum would move the
    weights by about 1e-3. (3 -> 2 rather than 4 -> 3: the same uneven cuts, 2 processes fewer a launch.)"""
    # no clipping: each strategy sums the norm in its own order and precision, and the factor it gives
    # would move the weights by more than the momentum's own rounding (7e-6 at SGD's default of 2)
    syncs = {"zero3": ["sync=zero", "sync.zero_stage=3"], "fsdp": ["sync=fsdp"], "flat": ["sync=flat"]}
    weights = _stopped_then_finished(tiny_fmnist, tmp_path, syncs, 3, 2)
    for sharded in ("zero3", "fsdp"):
        assert max((weights[sharded][k] - weights["flat"][k]).abs().max().item() for k in weights["flat"]) < 1e-6


def _stopped_then_finished(tiny_fmnist, tmp_path, syncs: dict, before: int, after: int) -> dict:
    """Each sync's LeNet (SGD with momentum, no clipping) stopped at step 8 on `before` ranks and finished on
    `after`, two launches at a time: each one's model.pt."""
    from concurrent.futures import ThreadPoolExecutor
    common = ["data.batch_size=96", "trainer.amp=off", "optim.schedule=constant", "optim.clip_grad_norm=0",
              "dist.timeout_s=120"]

    def launch(name, nproc, *extra):
        return run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, tmp_path / name) + common + syncs[name] +
                          list(extra), nproc=nproc)

    with ThreadPoolExecutor(2) as pool:
        for done in pool.map(lambda n: launch(n, before, "trainer.max_steps=8"), syncs):
            assert done.returncode == 0, done.stderr[-3000:]
        for rest in pool.map(lambda n: launch(n, after, "trainer.resume=auto"), syncs):
            assert rest.returncode == 0, rest.stderr[-3000:]
            assert f"(step 8, epoch 2, batch 2) on {after} ranks, written by {before}" in rest.stdout
    for name in syncs:  # (flat: a plain run stopped on N ranks, finished on M)
        s = read_summary(tmp_path / name)
        assert s["world_sizes"] == [[0, before], [8, after]] and (s["steps"], s["global_batch"]) == (12, 96)
    return {name: torch.load(tmp_path / name / "model.pt", weights_only=True) for name in syncs}


@pytest.mark.system
def test_shards_cut_over_an_island_are_cut_again_from_island_0s(tiny_fmnist, tmp_path):
    """HSDP (2 islands of 2, each sharding the weights and SGD's momentum over its 2 ranks) stopped on 4 ranks
    and finished on 2 ends where flat does; 2 islands of 2 with ZeRO stage 2 inside, where DDP inside does:
    island 0's shards joined and cut again are island 0's whole state (within the sums' order)."""
    islands = ["sync=diloco", "sync.every=3", "sync.islands=2"]
    syncs = {"hsdp": ["sync=fsdp", "sync.islands=2"], "flat": ["sync=flat"],
             "zero": [*islands, "sync/inner=zero", "sync.inner.zero_stage=2"], "ddp": [*islands, "sync/inner=ddp"]}
    weights = _stopped_then_finished(tiny_fmnist, tmp_path, syncs, 4, 2)
    for mine, like in (("hsdp", "flat"), ("zero", "ddp")):
        assert max((weights[mine][k] - weights[like][k]).abs().max().item() for k in weights[like]) < 1e-6, mine


def test_shards_that_do_not_fit_this_run_are_refused_in_one_line():
    """At the same world size a rank loads its own optimizer shards: a checkpoint written with other
    buckets (another sync.bucket_cap_mb, or stage 1's single shard of earlier versions) is refused."""
    from types import SimpleNamespace

    from ddp_lab.checkpoint.state import restore
    from ddp_lab.config import ConfigError
    from ddp_lab.sync.base import Capabilities

    pieces = [torch.zeros(2, requires_grad=True) for _ in range(3)]
    tr = SimpleNamespace(sync=SimpleNamespace(caps=Capabilities(shards=True), parameters=lambda: pieces, shards_over=2),
                         optimizer=torch.optim.SGD(pieces, lr=0.1))
    own = {"optimizer": {"state": {}, "param_groups": [{"params": [0]}]}}
    with pytest.raises(ConfigError, match=r"^this checkpoint's optimizer state does not fit this run's shards \(it "
                                          r"steps 1 shard\(s\) a rank, this run 3\): resume it with the "
                                          r"sync.zero_stage and sync.bucket_cap_mb that wrote it$"):
        restore(tr, {"world_size": 2}, own)


def _mapped(paths) -> list[str]:
    """Which of `paths` this process has mapped now (/proc/self/maps)."""
    maps = open("/proc/self/maps").read()
    return [str(p) for p in paths if str(p) in maps]


def test_a_zero_state_cut_again_from_mapped_files_leaves_none_of_them_mapped(tmp_path):
    """Every old rank's optimizer state is read mapped (only the rows taken are read); once loaded, the files go:
    a tensor of theirs kept (AdamW's step count, before) holds its file mapped and the pages read resident for
    the rest of the run."""
    import gc

    from ddp_lab.checkpoint.reshard import reshard_zero_state
    paths = [tmp_path / f"rank{r}.pt" for r in range(2)]
    for path, state in zip(paths, _zero_states(torch.arange(1.0, 11.0), 2)):
        torch.save(state, path)
    states = [torch.load(p, weights_only=True, mmap=True) for p in paths]
    assert _mapped(paths) == [str(p) for p in paths]
    pieces = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.AdamW([pieces])
    optimizer.load_state_dict(reshard_zero_state(states, [10], 0, 3))
    del states
    gc.collect()
    assert _mapped(paths) == [] and optimizer.state[pieces]["step"].item() == 5.0


def _fsdp_state_from_mapped_files(rank: int, world_size: int, tmp: str) -> list[str]:
    import gc

    from ddp_lab.distributed import DistEnv
    from ddp_lab.sync import build_sync
    from tests.sync import sync_cfg
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    sync = build_sync(sync_cfg("fsdp"), model, DistEnv(rank, world_size, 0, CPU, "gloo"))
    optimizer = torch.optim.AdamW(sync.param_groups())
    sync.module(torch.ones(4, 6)).sum().backward()
    sync.after_backward()
    optimizer.step()
    paths = [f"{tmp}/rank{r}.pt" for r in range(world_size)]
    torch.save(optimizer.state_dict(), paths[rank])
    torch.distributed.barrier()
    states = [torch.load(p, weights_only=True, mmap=True) for p in paths]
    optimizer.load_state_dict(sync.reshard_optimizer_state(states, optimizer))
    del states
    gc.collect()
    return _mapped(paths)


def test_an_fsdp_state_cut_again_from_mapped_files_leaves_none_of_them_mapped(tmp_path):
    from tests.multiproc import run_in_processes
    assert run_in_processes(_fsdp_state_from_mapped_files, 2, str(tmp_path), timeout=120) == [[], []]
