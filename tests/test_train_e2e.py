"""End to end: torchrun runs on a tiny Fashion-MNIST written by the test itself."""
import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import failure, read_summary, run_module, tiny_overrides

pytestmark = pytest.mark.system

SCALARS = ["loss/train", "acc/train", "acc/test", "perf/samples_per_sec",
           "perf/samples_per_sec_per_rank", "perf/step_ms", "perf/data_ms", "perf/epoch_s", "lr",
           "perf/mfu", "perf/compute_ms/rank0", "perf/sync_wait_ms/rank1", "perf/straggler_skew"]
SUMMARY_KEYS = ["test_acc", "test_correct", "test_total", "train_loss", "samples_per_sec",
                "samples_per_sec_per_rank", "sec_per_epoch", "epochs", "steps", "world_size",
                "backend", "comm_threads", "device", "model", "sync"]


@pytest.fixture(scope="module")
def two_rank_run(tiny_fmnist, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    profile = ["trainer.profile=true", "trainer.profile_wait=1", "trainer.profile_active=2"]
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, run_dir) + ["trainer.amp=off"] + profile,
                      nproc=2)
    assert proc.returncode == 0, failure(proc)
    return run_dir, proc


def test_summary_holds_the_run(two_rank_run):
    run_dir, _ = two_rank_run
    s = read_summary(run_dir)
    assert set(SUMMARY_KEYS) <= set(s)
    assert (s["world_size"], s["backend"], s["device"], s["model"], s["sync"]) == (
        2, "gloo", "cpu", "lenet_fast", "flat/builtin")  # sync=auto: flat on CPU
    # machine tuning is opt-in: gloo's threads stay at normal priority unless asked for
    assert s["comm_threads"] == "normal"
    assert s["test_total"] == 203
    assert s["test_acc"] == pytest.approx(s["test_correct"] / 203)
    assert s["epochs"] == 2 and s["steps"] == 2 * (512 // 64)
    assert s["samples_per_sec"] == pytest.approx(2 * s["samples_per_sec_per_rank"])
    assert s["samples_per_sec"] > 0
    assert s["test_acc"] > 0.5  # the tiny set is easy: it must have learned something
    # MFU: LeNet's FLOPs per image (torch's counter) x images/s over the measured peak
    assert s["flops_per_sample"] > 0 and s["peak_flops"] > 0
    assert 0 < s["mfu"] < 1
    assert s["mfu"] == pytest.approx(s["flops_per_sample"] * s["samples_per_sec"] / s["peak_flops"])
    assert s["straggler"] is None or s["straggler"]["rank"] in (0, 1)


def test_tensorboard_tags_read_back(two_rank_run):
    run_dir, _ = two_rank_run
    files = list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1  # rank 0 alone writes TensorBoard
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = acc.Tags()
    assert set(SCALARS) <= set(tags["scalars"])
    test_acc = [e.value for e in acc.Scalars("acc/test")]
    assert len(test_acc) == 2
    assert test_acc[-1] == pytest.approx(read_summary(run_dir)["test_acc"], abs=1e-6)
    assert "config/text_summary" in tags["tensors"]
    assert acc.PluginTagToContent("hparams")  # the HParams tab has this run (KeyError if absent)


def test_run_directory_is_shared_and_complete(two_rank_run):
    run_dir, proc = two_rank_run
    assert (run_dir / "rank0.log").exists() and (run_dir / "rank1.log").exists()
    assert (run_dir / ".hydra" / "config.yaml").exists()
    state = torch.load(run_dir / "model.pt", weights_only=True)
    assert state["7.weight"].shape == (128, 800)
    # rank 0 alone prints the epoch lines and d2l's closing line
    assert proc.stdout.count("epoch 2/2") == 1
    assert "on 2 x cpu (gloo)" in proc.stdout


def test_one_process_without_torchrun_matches_two_ranks(two_rank_run, tiny_fmnist, tmp_path):
    """Golden loss: the same global batches give the same training at world size 1 and 2."""
    run_dir, _ = two_rank_run
    single = tmp_path / "single"
    proc = run_module("ddp_lab.train", tiny_overrides(tiny_fmnist, single) + ["trainer.amp=off"],
                      nproc=0)
    assert proc.returncode == 0, failure(proc)
    a, b = read_summary(single), read_summary(run_dir)
    assert a["world_size"] == 1 and a["backend"] == "none"
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert a["test_correct"] == b["test_correct"]
    wa = torch.load(single / "model.pt", weights_only=True)
    wb = torch.load(run_dir / "model.pt", weights_only=True)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-5), k


def test_multirun_sweep_under_torchrun_gives_one_dir_per_job(tiny_fmnist, tmp_path):
    sweep = tmp_path / "sweep"
    args = [a for a in tiny_overrides(tiny_fmnist, tmp_path / "unused") if not a.startswith("hydra.")]
    proc = run_module("ddp_lab.train", ["-m", "seed=1,2", "trainer.epochs=1", "trainer.max_steps=3",
                                        f"hydra.sweep.dir={sweep}", *args], nproc=2)
    assert proc.returncode == 0, failure(proc)
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == ["0", "1"]
    seeds = [read_summary(sweep / j)["seed"] for j in jobs]
    assert seeds == [1, 2]
    assert all(read_summary(sweep / j)["world_size"] == 2 for j in jobs)


def test_profile_writes_a_timeline_per_rank(two_rank_run):
    run_dir, _ = two_rank_run
    for rank in (0, 1):
        events = json.loads((run_dir / "profile" / f"rank{rank}.json").read_text())["traceEvents"]
        names = [e.get("name", "") for e in events]
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2  # profile_active steps
        assert any("allreduce" in n.lower() or "all_reduce" in n.lower() for n in names)
        assert any("Backward" in n for n in names)  # communication seen against the backward pass
        table = (run_dir / "profile" / f"rank{rank}.txt").read_text()
        assert table.startswith(f"The 25 ops with the most self CPU time over the 2 profiled step(s) of "
                                f"this rank (rank{rank})")
        assert "Self CPU %" in table and "aten::" in table


def test_a_run_can_be_drawn(two_rank_run, tmp_path):
    from ddp_lab.tools.bench.run_plot import plot_run, scalars
    run_dir, _ = two_rank_run
    data = scalars(run_dir)
    assert len(data["loss/train"]) == len(data["acc/test"]) == 2  # one point per epoch
    assert data["acc/test"][-1][1] == pytest.approx(read_summary(run_dir)["test_acc"], abs=1e-6)
    png = plot_run(run_dir, tmp_path / "run.png", title="tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
