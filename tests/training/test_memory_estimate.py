"""The memory a rank's training takes, estimated before the first step: refused where it cannot fit."""
import logging

import pytest
import torch
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError, schema
from ddp_lab.distributed import DistEnv
from ddp_lab.models.gpt import gpt
from ddp_lab.training import fit_check, memory_estimate
from ddp_lab.training.fit_check import check_fits_memory
from ddp_lab.training.memory_estimate import GiB, activation_bytes, estimate, optimizer_state
from ddp_lab.training.tasks import CLASSIFICATION, LANGUAGE_MODEL, REGRESSION
from ddp_lab.training.trainer import Trainer
from tests.multiproc import run_in_processes
from tests.workloads import linear

CPU = torch.device("cpu")
TOKENS = torch.zeros(64, dtype=torch.long)


def _gpt(compose_train, *extra):
    return compose_train(["model=gpt", "data=text", "optim=adamw", *extra])


def _groups(cfg):
    return cfg.model, cfg.optim


def test_the_optimizers_state_per_parameter(compose_train):
    assert optimizer_state(compose_train(["optim=adamw"]).optim) == (2, "AdamW")  # two moments
    assert optimizer_state(compose_train([]).optim) == (1, "SGD")  # momentum 0.9
    plain = compose_train(["optim.momentum=0", "optim.nesterov=false"]).optim
    assert optimizer_state(plain) == (0, "SGD")
    rms = compose_train(["optim=custom", "optim._target_=torch.optim.RMSprop"]).optim
    assert optimizer_state(rms) == (2, "RMSprop")  # any other: counted as Adam


def test_activations_are_what_autograd_saves_and_attention_is_linear_in_the_context():
    with torch.device("meta"):
        mlp = linear()  # 8 -> 32 -> ReLU -> 4
    # per sample: the input (8 floats), the hidden ReLU output (32: saved once, by ReLU and the
    # second layer alike), the log-probabilities (4), the target (an int64); once: the loss's scalar weight
    assert activation_bytes(mlp, torch.zeros(8), torch.tensor(0), CLASSIFICATION) == (8 + 32 + 4) * 4 + 8 + 4
    assert activation_bytes(mlp, torch.zeros(8), torch.tensor(0), CLASSIFICATION, batch=5) == 5 * 184 + 4
    per_sample = {}
    for t in (1024, 4096):
        with torch.device("meta"):
            net = gpt(block_size=t)
        ids = torch.zeros(t, dtype=torch.long)
        per_sample[t] = activation_bytes(net, ids, ids, LANGUAGE_MODEL)
        # at least the residual stream: 4 layers of t x 128 floats, saved several times each
        assert per_sample[t] > 4 * t * 128 * 4 * 8
    # the fused CPU kernel keeps no T x T score matrix: 4 x the context, 4 x the bytes (not 16 x)
    assert 3.9 < per_sample[4096] / per_sample[1024] < 4.1


def test_model_state_counts_weights_gradients_and_adams_moments(compose_train):
    e = estimate(*_groups(_gpt(compose_train)), TOKENS, TOKENS, LANGUAGE_MODEL, batch=32)
    assert (e.parameters, e.weight_bytes, e.optimizer_bytes) == (834_304, 834_304 * 4, 834_304 * 8)
    assert e.state_bytes == 834_304 * 16 and e.optimizer == "AdamW"
    one, two = (estimate(*_groups(_gpt(compose_train)), TOKENS, TOKENS, LANGUAGE_MODEL, n) for n in (1, 2))
    assert e.activation_bytes - one.activation_bytes == 31 * (two.activation_bytes - one.activation_bytes)
    assert e.total_bytes == e.state_bytes + e.activation_bytes


@pytest.mark.parametrize("model,data,optim,batch,under_gib", [
    ("lenet_fast", "fashion_mnist", "sgd", 256, 0.05), ("lenet", "fashion_mnist", "sgd", 256, 0.05),
    ("resnet18", "fashion_mnist", "sgd", 256, 1.2), ("gpt", "text", "adamw", 32, 0.1),
    ("gpt_small", "text", "adamw", 32, 1.5),
])
def test_the_shipped_runs_at_two_ranks_fit_a_small_machine(compose_train, model, data, optim, batch, under_gib):
    cfg = compose_train([f"model={model}", f"data={data}", f"optim={optim}"])
    x, y = ((torch.zeros(cfg.model.block_size, dtype=torch.long),) * 2 if data == "text"
            else (torch.zeros(1, 28, 28), torch.tensor(0)))
    task = LANGUAGE_MODEL if data == "text" else CLASSIFICATION
    assert batch == cfg.data.batch_size // 2  # the preset's global batch over 2 ranks
    assert estimate(cfg.model, cfg.optim, x, y, task, batch).total_bytes < under_gib * GiB


def test_a_long_context_is_refused_with_the_estimate_the_memory_and_what_to_lower(compose_train, monkeypatch):
    """model.block_size=100000: about 3.3 GiB of activations a sample (the fused attention keeps
    no T x T matrix: that would be 640 GB), so 8 samples per rank do not fit 12 GiB."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = _gpt(compose_train, "model.block_size=100000")
    ids = torch.zeros(100_000, dtype=torch.long)
    env = DistEnv(0, 2, 0, CPU, "gloo")
    fits = check_fits_memory(cfg.model, cfg.optim, env, ids, ids, LANGUAGE_MODEL, batch=1, available=24 * GiB)
    assert 3 * GiB < fits.activation_bytes < 4 * GiB
    with pytest.raises(ConfigError) as e:
        check_fits_memory(cfg.model, cfg.optim, env, ids, ids, LANGUAGE_MODEL, batch=8, available=24 * GiB)
    big = estimate(cfg.model, cfg.optim, ids, ids, LANGUAGE_MODEL, 8)
    assert str(e.value) == (
        f"model=gpt needs about {big.total_bytes / GiB:.1f} GiB per rank, more than the 12.0 GiB available to each "
        f"of the 2 rank(s) on this machine (MemAvailable 24.0 GiB): activations {big.activation_bytes / GiB:.1f} "
        f"GiB (8 samples per rank, what autograd keeps for the backward), model state {big.state_bytes / GiB:.1f} "
        f"GiB (13,626,112 parameters: weights, gradients and AdamW's state); lower data.batch_size or the context, "
        f"model.block_size (activations grow with both; trainer.grad_accum keeps the samples per step), or run "
        f"fewer ranks per machine (trainer.memory_check=false: try anyway)")
    assert 25 * GiB < big.total_bytes < 30 * GiB


def test_a_run_within_the_estimates_error_of_the_limit_is_refused(compose_train, monkeypatch):
    """Under the memory, but by less than the estimate's 15% error of its predicted peak: refused, so that
    "fits" is never said to a run the limit may kill (tests/training/test_fit_check_records.py)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(fit_check, "runtime_bytes", lambda: 0)  # the peak: what the run adds
    cfg = _gpt(compose_train)
    env = DistEnv(0, 1, 0, CPU, "none")
    e = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32)
    roomy = int(1.16 * e.total_bytes)
    assert check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32,
                             available=roomy) is not None
    with pytest.raises(ConfigError, match="within the estimate's 15% error of the"):
        check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32,
                          available=int(1.1 * e.total_bytes))


def test_the_peak_counts_torch_compile_and_the_datas_loading_but_the_check_refuses_by_what_is_ahead(
        compose_train, monkeypatch, caplog):
    """A compiled run adds COMPILE_BYTES; the predicted peak is the loading's where that was higher (the measured
    peak is the whole run's), but the check refuses by what is still to come: the loading has passed."""
    cfg = _gpt(compose_train)
    eager = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32, runtime=GiB)
    compiled = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32, runtime=GiB, compiled=True)
    assert compiled.peak_bytes - eager.peak_bytes == compiled.compile_bytes == memory_estimate.COMPILE_BYTES > 0
    assert eager.peak_bytes == eager.ahead_bytes == GiB + eager.total_bytes
    loaded = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32, runtime=GiB,
                      loaded_peak=eager.peak_bytes + 2**20)
    assert loaded.peak_bytes == eager.peak_bytes + 2**20 and loaded.ahead_bytes == eager.ahead_bytes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(fit_check, "runtime_bytes", lambda: 0)
    monkeypatch.setattr(fit_check, "peak_runtime_bytes", lambda: 3 * eager.total_bytes)  # (loading, passed)
    env = DistEnv(0, 1, 0, CPU, "none")
    with caplog.at_level(logging.INFO, logger="ddp_lab"):
        e = check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32,
                              available=int(1.2 * eager.total_bytes))
    assert e.peak_bytes == 3 * eager.total_bytes and "(the data's loading peaked there;" in caplog.text
    with pytest.raises(ConfigError, match="per rank, more than the"):  # the compiler's share too
        check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32,
                          available=int(1.2 * eager.total_bytes), compiled=True)


def test_the_dataloaders_workers_are_weighed_beside_the_ranks_own_peak(compose_train, monkeypatch):
    """Processes of their own: not in the rank's predicted peak (summary.json compares it with the rank's own RSS),
    but in what its host must hold, so a run that fits without them can be refused with them."""
    cfg = _gpt(compose_train)
    alone = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32)
    four = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32, workers=4)
    assert four.worker_bytes == 4 * memory_estimate.WORKER_BYTES and four.peak_bytes == alone.peak_bytes
    assert four.host_bytes == alone.host_bytes + four.worker_bytes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(fit_check, "runtime_bytes", lambda: 0)
    env, roomy = DistEnv(0, 1, 0, CPU, "none"), int(1.2 * alone.total_bytes)
    assert check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32,
                             available=roomy) is not None
    with pytest.raises(ConfigError, match=r"DataLoader workers 0\.2 GiB \(data\.num_workers\)"):
        check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32, available=roomy,
                          workers=4)
    # one worker, but a dataset of Python objects it may copy: priced beside it, named in the refusal
    copying = estimate(cfg.model, cfg.optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32, workers=1, copied=150 * 2**20)
    assert copying.worker_bytes == memory_estimate.WORKER_BYTES + 150 * 2**20 and copying.workers == 1
    with pytest.raises(ConfigError, match=r"0\.2 GiB \(data\.num_workers, and the copies they may make of the "
                                          r"data's Python objects"):
        check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32, available=roomy,
                          workers=1, copied=150 * 2**20)


def test_memory_check_false_only_warns_and_a_gpu_is_not_checked(compose_train, caplog):
    cfg = _gpt(compose_train, "trainer.memory_check=false")
    env = DistEnv(0, 1, 0, CPU, "none")
    with caplog.at_level(logging.WARNING, logger="ddp_lab"):
        e = check_fits_memory(cfg.model, cfg.optim, env, TOKENS, TOKENS, LANGUAGE_MODEL, batch=32, available=2**20,
                              refuse=cfg.trainer.memory_check)
    assert e.total_bytes > 2**20
    assert "model=gpt needs about 0.1 GiB per rank, more than the 0.0 GiB available" in caplog.text
    assert check_fits_memory(cfg.model, cfg.optim, DistEnv(0, 1, 0, torch.device("cuda"), "nccl"), TOKENS, TOKENS,
                             LANGUAGE_MODEL, batch=32, available=2**20) is None


def test_a_large_model_is_told_to_shrink_not_to_lower_the_batch(compose_train):
    cfg = compose_train(["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=4096",
                         "+model.out_features=4096", "optim=adamw"])
    e = estimate(cfg.model, cfg.optim, torch.zeros(4096), torch.zeros(4096), REGRESSION, batch=1)
    line = fit_check.describe(e, cfg.model, 0, available=2**20, ranks=1, machine=(2**20, "MemAvailable"))
    assert line.endswith("model state 0.3 GiB (16,781,312 parameters: weights, gradients and AdamW's state); shard "
                         "the model state over the ranks (sync=zero sync.zero_stage=3), use a smaller model or an "
                         "optimizer with less state (optim=sgd), or run fewer ranks per machine")


def test_under_zero_a_rank_counts_its_shard_of_the_optimizer_state(compose_train):
    big = ["model=custom", "model._target_=torch.nn.Linear", "+model.in_features=4096", "+model.out_features=4096",
           "optim=adamw"]
    x = torch.zeros(4096)
    cfg = compose_train(big)
    ddp = estimate(cfg.model, cfg.optim, x, x, REGRESSION, batch=1)
    zero = estimate(cfg.model, cfg.optim, x, x, REGRESSION, batch=1, shards=4)
    weights = 4 * 16_781_312
    assert (ddp.weight_bytes, ddp.optimizer_bytes) == (weights, 2 * weights)  # each rank all of AdamW's moments
    assert (zero.weight_bytes, zero.optimizer_bytes) == (weights, 2 * weights // 4)  # a quarter of them
    assert (ddp.state_bytes, zero.state_bytes) == (4 * weights, 2 * weights + 2 * weights // 4)  # stage 1: 8 + 8/N
    two = estimate(cfg.model, cfg.optim, x, x, REGRESSION, batch=1, shards=4, stage=2)
    assert two.state_bytes == weights + 3 * weights // 4  # stage 2: 4 + 12/N bytes a parameter
    three = estimate(cfg.model, cfg.optim, x, x, REGRESSION, batch=1, shards=4, stage=3)
    assert three.state_bytes == 4 * weights // 4  # stage 3: 16/N
    line = fit_check.describe(zero, cfg.model, 1, available=2**20, ranks=4, machine=(2**22, "MemAvailable"))
    assert "; shard the gradients and the weights too (sync.zero_stage=3), use a smaller model" in line
    line = fit_check.describe(three, cfg.model, 3, available=2**20, ranks=4, machine=(2**22, "MemAvailable"))
    assert line.endswith("use a smaller model or an optimizer with less state (optim=sgd), shard it over at least "
                         "269 ranks (each with this much memory), or run fewer ranks per machine")
    # where an eighth of the whole state (16 bytes a parameter) and the activations fit, 8 ranks would do
    room = three.activation_bytes + 4 * weights // 8
    line = fit_check.describe(three, cfg.model, 3, available=room, ranks=4, machine=(2**22, "MemAvailable"))
    assert line.endswith("(optim=sgd), shard it over at least 8 ranks (each with this much memory), or run fewer "
                         "ranks per machine")


def test_the_trainer_refuses_a_run_that_cannot_fit_before_any_step(compose_train, tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    monkeypatch.setattr(fit_check, "mem_available", lambda n: (64 * 2**20, 1, "MemAvailable"))  # 64 MiB
    cfg = _gpt(compose_train, f"data.path={tmp_path}/c.txt", "data.batch_size=32", "trainer.compile=false",
               "trainer.amp=off")  # (fp32 on any CPU: amp=auto is bf16 where the CPU has it)
    schema.check(cfg)
    with pytest.raises(ConfigError, match=r"^model=gpt needs about 0\.08 GiB per rank, more than the 0\.06 GiB"):
        Trainer.from_config(cfg, DistEnv(0, 1, 0, CPU, "none"), tmp_path).close()


class _ReadsItsWeights(torch.nn.Module):
    """A user's model whose constructor reads a value: it cannot be built on meta."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 4)
        self.scale = float(self.layer.weight.detach().abs().max())


def test_a_model_that_cannot_be_built_on_meta_is_not_estimated_and_the_run_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(memory_estimate, "build_model", lambda cfg: _ReadsItsWeights())
    cfg = OmegaConf.create({"model": {}, "optim": {"_target_": "torch.optim.SGD"}, "trainer": {}})
    env = DistEnv(0, 1, 0, torch.device("cpu"), "none")
    with caplog.at_level("INFO", logger="ddp_lab"):
        assert check_fits_memory(cfg.model, cfg.optim, env, torch.zeros(8), torch.tensor(0), None, 4,
                                 available=2**30) is None
    assert "memory estimate: not made (the model cannot be built on the meta device" in caplog.text


def test_a_need_and_a_room_that_round_alike_are_told_apart():
    e = memory_estimate.Estimate(10, 2**20, 0, int(1.22 * GiB) - 2 * 2**20, 1, "SGD")
    line = fit_check.describe(e, {"name": "gpt"}, 0, available=int(1.2 * GiB), ranks=1,
                                    machine=(2 * GiB, "MemAvailable"))
    assert line.startswith("model=gpt needs about 1.22 GiB per rank, more than the 1.20 GiB available to each")


def _check_with_one_rank_short(rank: int, world_size: int, model: dict, optim: dict, short: int):
    """Rank `short`'s memory 10% over its estimate (refused), the others' ample: each rank's outcome."""
    fit_check.runtime_bytes = lambda: 0  # (this process's own: the peak is what the run adds)
    model, optim = OmegaConf.create(model), OmegaConf.create(optim)
    need = estimate(model, optim, TOKENS, TOKENS, LANGUAGE_MODEL, 32).total_bytes
    available = world_size * (int(1.1 * need) if rank == short else 100 * need)
    try:
        check_fits_memory(model, optim, DistEnv(rank, world_size, 0, CPU, "gloo"), TOKENS, TOKENS, LANGUAGE_MODEL,
                          batch=32, available=available)
    except ConfigError as e:
        return str(e)
    return "fits"


def test_where_one_rank_cannot_hold_the_run_every_rank_refuses_it(compose_train):
    cfg = _gpt(compose_train)
    model, optim = (OmegaConf.to_container(c, enum_to_str=True) for c in (cfg.model, cfg.optim))  # (pickled)
    ok, short = run_in_processes(_check_with_one_rank_short, 2, model, optim, 1)
    assert "within the estimate's 15% error of the" in short and short.endswith("try anyway)")
    assert ok == ("rank 1's memory cannot hold this run (its line says what to lower); this rank's can "
                  "(trainer.memory_check=false: try anyway)")
    assert run_in_processes(_check_with_one_rank_short, 2, model, optim, 2) == ["fits", "fits"]  # (no rank 2)
