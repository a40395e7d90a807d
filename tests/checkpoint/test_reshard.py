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
@pytest.mark.parametrize("before,after", [(4, 2), (2, 3)])
def test_a_run_stopped_on_n_ranks_finishes_on_m(tiny_fmnist, tmp_path, before, after):
    args = tiny_overrides(tiny_fmnist, tmp_path / "run") + [
        "data.batch_size=96", "trainer.amp=off", "optim.schedule=constant"]
    part = run_module("ddp_lab.train", args + ["trainer.max_steps=8"], nproc=before)  # epoch 2, batch 2
    assert part.returncode == 0, part.stderr[-3000:]
    rest = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=after)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert (f"(step 8, epoch 2, batch 2) on {after} ranks, written by {before}") in rest.stdout
    s = read_summary(tmp_path / "run")
    assert s["world_sizes"] == [[0, before], [8, after]]
    assert (s["steps"], s["epochs"], s["global_batch"]) == (12, 2, 96)
    assert s["test_acc"] > 0.5  # learned, as an uninterrupted run does on the tiny set


@pytest.mark.system
@pytest.mark.parametrize("sync", [["sync=diloco", "sync.every=3"], ["sync=powersgd", "sync.powersgd_start_step=2"]],
                         ids=["diloco", "powersgd"])
def test_per_rank_sync_state_is_reconciled_by_the_rule(tiny_fmnist, tmp_path, sync):
    """Stopped at step 8 on 2 ranks (DiLoCo between synchronisations, PowerSGD with error
    feedback under way), finished on 3: rank 0's weights for all, no error feedback."""
    args = tiny_overrides(tiny_fmnist, tmp_path / "run") + [
        "data.batch_size=96", "trainer.amp=off", "optim.schedule=constant", *sync]
    part = run_module("ddp_lab.train", args + ["trainer.max_steps=8"], nproc=2)
    assert part.returncode == 0, part.stderr[-3000:]
    rest = run_module("ddp_lab.train", args + ["trainer.resume=auto"], nproc=3)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "on 3 ranks, written by 2" in rest.stdout
    logs = "".join((tmp_path / "run" / f"rank{r}.log").read_text() for r in range(3))
    assert logs.count("resumed at another world size: every rank continues from rank 0's weights") == 3
    s = read_summary(tmp_path / "run")
    assert s["world_sizes"] == [[0, 2], [8, 3]] and s["steps"] == 12
    assert s["test_acc"] > 0.3  # learned: three times chance (DiLoCo every 3 learns slowest in 12 steps)
