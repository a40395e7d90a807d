"""d2l_scratch: the seeds' allreduce and data-parallel step, and a run end to end."""
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_lab.tools.baselines import d2l
from ddp_lab.tools.baselines import d2l_scratch as s
from ddp_lab.tools.baselines import data_parallel as dp
from tests.conftest import failure, read_summary, run_module

CPU = torch.device("cpu")
# The trainer's summary.json keys: a baseline run fits the same tables and dashboards.
TRAINER_KEYS = {"test_acc", "test_correct", "test_total", "train_loss", "train_acc",
                "samples_per_sec", "samples_per_sec_per_rank", "sec_per_epoch", "step_ms",
                "data_ms", "epochs", "steps", "world_size", "backend", "device", "model",
                "sync", "global_batch", "amp", "seed", "measured_steps", "comm_timing",
                "comm_ms_per_step", "comm_frac", "peak_mem_mb"}
TRAINER_TAGS = {"loss/train", "acc/train", "acc/test", "perf/samples_per_sec",
                "perf/samples_per_sec_per_rank", "perf/step_ms", "perf/data_ms", "perf/epoch_s", "lr"}


def test_allreduce_sums_a_list_of_tensors():
    data = [torch.ones((1, 2)) * (i + 1) for i in range(3)]
    s.allreduce(data)
    for t in data:
        assert torch.equal(t, torch.full((1, 2), 6.0))
    assert len({t.data_ptr() for t in data}) == 3  # still three tensors, summed in place


def test_get_params_copies_even_onto_the_same_device():
    params = s.init_params()
    a, b = s.get_params(params, CPU), s.get_params(params, CPU)
    assert all(p.requires_grad and p.data_ptr() != q.data_ptr() for p, q in zip(a, b))
    assert all(torch.equal(p, q) for p, q in zip(a, params))


def test_split_batch_on_the_cpu_fallback():
    X, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    Xs, ys = s.split_batch(X, y, [CPU, CPU])
    assert [len(t) for t in ys] == [3, 2]  # as nn.parallel.scatter splits 5 over 2
    assert torch.equal(torch.cat(Xs), X) and torch.equal(torch.cat(ys), y)


def test_two_devices_take_the_step_of_one_whole_batch():
    """Scatter + per-device backward + allreduce + SGD = plain SGD on the batch-mean loss."""
    torch.manual_seed(0)
    params = [p * 30 for p in s.init_params()]  # larger weights: gradients well above rounding
    X, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    lr = 0.2
    reference = [p.clone().requires_grad_() for p in params]
    torch.nn.functional.cross_entropy(s.lenet(X, reference), y).backward()
    expected = [p.detach() - lr * p.grad for p in reference]
    for n in (1, 2):
        device_params = [s.get_params(params, CPU) for _ in range(n)]
        loss_sum, correct = s.train_batch(X, y, device_params, [CPU] * n, lr)
        assert 0 <= int(correct) <= 8 and loss_sum.item() > 0
        for copy in device_params:  # every copy ends the step identical
            for got, want in zip(copy, expected):
                torch.testing.assert_close(got.detach(), want, rtol=1e-4, atol=1e-6)
            assert all(float(p.grad.abs().max()) == 0 for p in copy)  # d2l.sgd zeroed the grads


def test_sgd_divides_by_the_batch_size():
    p = torch.ones(3, requires_grad=True)
    p.grad = torch.full((3,), 4.0)
    d2l.sgd([p], lr=0.5, batch_size=2)
    assert torch.equal(p.detach(), torch.zeros(3)) and torch.equal(p.grad, torch.zeros(3))


@pytest.mark.system
def test_end_to_end_run(tiny_fmnist, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_module("ddp_lab.tools.baselines.d2l_scratch", [
        f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}",
        "data.batch_size=64", "data.num_workers=0", "epochs=3", "num_devices=2", "threads=1",
        "warmup_steps=1", "log_every=4"], nproc=0)
    assert proc.returncode == 0, failure(proc)
    summary = read_summary(run_dir)
    assert TRAINER_KEYS | {"peak_mem_mb", "num_devices"} <= set(summary)
    assert (summary["model"], summary["sync"], summary["world_size"], summary["num_devices"]) == (
        "lenet_scratch", "d2l_allreduce", 1, 2)
    assert summary["epochs"] == 3 and summary["steps"] == 3 * 512 // 64
    assert summary["measured_steps"] == summary["steps"] - 1  # warm-up left out
    assert summary["test_total"] == 203
    assert summary["test_acc"] == pytest.approx(summary["test_correct"] / 203)
    assert summary["samples_per_sec"] > 0 and summary["sec_per_epoch"] > 0
    assert summary["peak_mem_mb"] > 50
    assert "test acc" in proc.stdout and "epoch 3/3" in proc.stdout

    tb = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    assert TRAINER_TAGS <= set(tb.Tags()["scalars"])
    losses = [e.value for e in tb.Scalars("loss/train")]
    assert len(losses) == 3
    # N(0, 0.01^2) weights learn slowly at first, but the loss falls every epoch.
    assert losses[0] > losses[1] > losses[2]
    assert losses[0] == pytest.approx(2.3026, abs=0.01)  # starts at log(10): uniform outputs


@pytest.mark.parametrize("name, lr, devices", [("d2l_scratch", 0.2, 2), ("data_parallel", 0.1, 0)])
def test_configs_hold_the_chapter_defaults_and_are_typed(name, lr, devices):
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose(config_name=f"baseline_{name}", return_hydra_config=True)
        assert (cfg.epochs, cfg.lr, cfg.num_devices, cfg.data.batch_size) == (10, lr, devices, 256)
        assert cfg.hydra.run.dir.startswith(f"outputs/baselines/{name}/")
        with pytest.raises(ConfigCompositionException):
            compose(config_name=f"baseline_{name}", overrides=["epochs=ten"])
        with pytest.raises(ConfigCompositionException):
            compose(config_name=f"baseline_{name}", overrides=["bogus=1"])


@pytest.mark.parametrize("name, override, message", [
    ("d2l_scratch", "lr=-1", "lr=-1.0 must be >= 0"),
    ("d2l_scratch", "epochs=0", "epochs=0 must be >= 1"),
    ("d2l_scratch", "num_devices=0", "num_devices=0 must be >= 1"),
    ("d2l_scratch", "data.batch_size=1",
     "data.batch_size=1 must be >= 2 (every one of the 2 devices needs a share of each batch)"),
    ("data_parallel", "num_devices=-1", "num_devices=-1 must be >= 0"),
    ("data_parallel", "data.num_workers=-1", "data.num_workers=-1 must be >= 0"),
    ("data_parallel", "threads=-2", "threads=-2 must be >= 0 (0: torch's default)"),
])
def test_bad_values_stop_with_the_key_and_exit_2(name, override, message, capsys):
    from hydra import compose, initialize_config_module

    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        cfg = compose(config_name=f"baseline_{name}", overrides=[override])
    with pytest.raises(SystemExit) as e:
        {"d2l_scratch": s, "data_parallel": dp}[name].check(cfg)  # what each main() calls first
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"ddp_lab: error: {message}"


def test_a_run_dir_with_an_earlier_run_is_refused(tmp_path, capsys):
    d2l.refuse_an_earlier_run(tmp_path)  # empty: fine
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        d2l.refuse_an_earlier_run(tmp_path)
    assert e.value.code == 2
    assert f"hydra.run.dir={tmp_path} already holds an earlier run" in capsys.readouterr().err
