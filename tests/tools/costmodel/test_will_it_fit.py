"""costmodel.will_it_fit: each strategy's memory per rank and its price on a link, before a run."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddp_lab.distributed import DistEnv
from ddp_lab.models.lenet import lenet
from ddp_lab.sync import build_sync
from ddp_lab.telemetry.memory import model_state_bytes as held_bytes
from ddp_lab.tools.costmodel import will_it_fit
from ddp_lab.tools.costmodel.formulas import ring
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

LENET = 129_068  # parameters (each of its layers an even number: nothing padded at 2 ranks)
# (0.1 MB buffers and buckets: LeNet's 0.5 MB of gradients in several)
SYNCS = {"ddp": sync_cfg("flat", "builtin", buffer_mb=0.1),
         **{f"zero{k}": sync_cfg("zero", "builtin", zero_stage=k, bucket_cap_mb=0.1) for k in (1, 2, 3)}}


def _held_after_a_step(rank: int, world_size: int) -> dict:
    """What a rank holds after one real step of LeNet under SGD with momentum, per strategy."""
    env, out = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo"), {}
    for name, cfg in SYNCS.items():
        torch.manual_seed(0)
        model = lenet()
        sync = build_sync(cfg, model, env)
        opt = torch.optim.SGD(sync.parameters(), lr=0.1, momentum=0.9)
        F.cross_entropy(sync.module(torch.randn(4, 1, 28, 28)), torch.randint(0, 10, (4,))).backward()
        sync.after_backward()
        opt.step()
        out[name] = held_bytes(model, opt)["total"]  # (stage 3: between its gathers)
        opt.zero_grad(set_to_none=sync.caps.grads_set_to_none)
        sync.after_step(1)
    return out


def test_its_bytes_are_what_a_real_step_holds():
    assert sum(p.numel() for p in lenet().parameters()) == LENET
    held = run_in_processes(_held_after_a_step, 2, timeout=120)
    for name in SYNCS:
        assert held[0][name] == held[1][name] == will_it_fit.model_state_bytes(LENET, 1, 2, name), name
    # fp32 with momentum: 12 bytes a parameter under DDP; ZeRO's fractions of it
    assert [will_it_fit.model_state_bytes(LENET, 1, 2, s) for s in will_it_fit.STRATEGIES] == \
        [12 * LENET, 10 * LENET, 8 * LENET, 6 * LENET]


def test_the_table_says_what_fits_and_prices_each_on_the_link():
    p, gib = 10**8, 2**30  # 100M parameters, AdamW (2 tensors of state), 4 ranks
    rows = {r["strategy"]: r for r in will_it_fit.table(p, 2, gib // 4, 4, gib, 10**9, 50e-6, 100.0)}
    assert rows["ddp"]["model_state_bytes"] == 16 * p and rows["zero3"]["model_state_bytes"] == 4 * p
    # in 1 GiB with 0.25 GiB of activations: 1.6 GB, 1.0 GB, 0.7 GB and 0.4 GB of model state (stage 2: 0.97
    # GB, not 15% under 1.07)
    assert [rows[s]["fits"] for s in will_it_fit.STRATEGIES] == [False, False, False, True]
    assert rows["zero1"]["comm_ms"] == rows["ddp"]["comm_ms"] == pytest.approx(ring(4, 4 * p, 50e-6, 8e-9, 0) * 1e3)
    assert rows["zero3"]["wire_bytes"] == 1.5 * rows["ddp"]["wire_bytes"]
    # 9 messages and 9/4 N bytes against the ring's 6 and 6/4 N: 1.5x in both terms
    assert rows["zero3"]["comm_ms"] / rows["ddp"]["comm_ms"] == pytest.approx(1.5)
    assert rows["ddp"]["step_ms"] == pytest.approx(100.0 + rows["ddp"]["comm_ms"])
    # torch's reduce-scatter on gloo is an all-reduce keeping one chunk: stages 1 and 2 send 1.5 DDP's, stage 3 2x
    gloo = {r["strategy"]: r for r in will_it_fit.table(p, 2, gib // 4, 4, gib, 10**9, 50e-6, 100.0, "all-reduce")}
    assert [gloo[s]["comm_ms"] / rows["ddp"]["comm_ms"] for s in will_it_fit.STRATEGIES] == \
        pytest.approx([1.0, 1.5, 1.5, 2.0])


@pytest.mark.parametrize("overrides,travels", [
    ([], "ring"),  # sync=zero runs our direct collectives
    (["sync.algo=builtin"], "ring" if torch.cuda.is_available() else "all-reduce"),
    (["sync.algo=ring_textbook"], "ring"), (["sync.algo=builtin", "dist.backend=nccl"], "ring"),
    (["sync.algo=builtin", "dist.device=cpu"], "all-reduce")])
def test_the_reduce_scatter_is_priced_as_the_run_sends_it(compose_train, overrides, travels):
    assert will_it_fit.reduce_scatter_of(compose_train(["sync=zero", *overrides])) == travels


def test_activations_are_counted_under_autocast_as_the_runs_own_check_counts_them(compose_train, tiny_fmnist,
                                                                                  tmp_path):
    from ddp_lab.training.data import build_datasets, example
    from ddp_lab.training.memory_estimate import estimate
    from ddp_lab.training.tasks import choose_task
    data = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "model=lenet"]
    acts = {amp: will_it_fit.describe(compose_train([*data, f"trainer.amp={amp}"]), 2, 4)[3] for amp in ("off", "bf16")}
    cfg = compose_train([*data, "trainer.amp=bf16"])
    x, y = example(build_datasets(cfg.data)[0])
    run = estimate(cfg.model, cfg.optim, x, y, choose_task("auto", y, None), 4, autocast=torch.bfloat16)
    assert acts["bf16"]["ddp"] == run.activation_bytes != acts["off"]["ddp"] > 0, acts
    # stage 3 gathers bf16 weights (sync.param_dtype=amp): the run's check counts no casts of them, nor does this
    gathered = estimate(cfg.model, cfg.optim, x, y, choose_task("auto", y, None), 4, autocast=torch.bfloat16,
                        gathered=torch.bfloat16)
    assert acts["bf16"]["zero3"] == gathered.activation_bytes < acts["bf16"]["ddp"], acts
    assert acts["off"]["zero3"] == acts["off"]["ddp"]


def test_glibcs_regime_prices_a_sharded_models_freed_gathers_on_cpu_ranks_alone(compose_train, tiny_fmnist,
                                                                                tmp_path):
    """trainer.host_malloc=glibc keeps stage 3's freed gathers on a CPU rank (the run's check prices them: the
    weights whole); on a GPU the host's malloc holds no weights, and the estimate is the same."""
    data = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "model=lenet"]
    transient = {(m, d): will_it_fit.describe(compose_train([*data, f"trainer.host_malloc={m}", f"dist.device={d}"]),
                                              2, 4)[5]
                 for m in ("auto", "glibc") for d in ("cpu", "cuda")}
    assert transient["glibc", "cpu"]["zero3"] > transient["auto", "cpu"]["zero3"], transient
    assert transient["glibc", "cpu"]["ddp"] == transient["auto", "cpu"]["ddp"]
    assert transient["glibc", "cuda"] == transient["auto", "cuda"] == transient["auto", "cpu"]


def test_torch_compile_and_the_datas_loading_are_priced_where_the_run_meets_them(compose_train, tiny_fmnist, tmp_path):
    """trainer.compile as the run resolves it (auto: on for enough samples a rank; stage 3 runs eagerly); the
    loading's peak where it is above the sum (a rank goes through it too)."""
    from ddp_lab.training.memory_estimate import COMPILE_BYTES
    data = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "model=lenet", "dist.device=cpu"]
    compiler = {c: will_it_fit.describe(compose_train([*data, f"trainer.compile={c}"]), 2, 4)[6]
                for c in ("true", "false", "auto")}
    assert compiler["true"] == {"ddp": COMPILE_BYTES, "zero1": COMPILE_BYTES, "zero2": COMPILE_BYTES, "zero3": 0}
    assert set(compiler["false"].values()) == set(compiler["auto"].values()) == {0}  # (auto: a tiny set's few samples)
    gib = 2**30
    rows = {r["strategy"]: r for r in will_it_fit.table(10**6, 2, gib // 4, 4, gib, None, 0, None,
                                                        runtime=gib // 4, compiler=compiler["true"])}
    assert rows["ddp"]["peak_bytes"] - rows["zero1"]["peak_bytes"] == rows["ddp"]["model_state_bytes"] - \
        rows["zero1"]["model_state_bytes"]
    assert rows["zero2"]["peak_bytes"] == gib // 4 + rows["zero2"]["total_bytes"] + COMPILE_BYTES
    loaded = {r["strategy"]: r for r in will_it_fit.table(10**6, 2, gib // 4, 4, gib, None, 0, None,
                                                          runtime=gib // 4, loaded=gib)}
    assert [r["peak_bytes"] for r in loaded.values()] == [gib] * 4 and not any(r["fits"] for r in loaded.values())
    # the DataLoader's workers: beside a rank's peak, weighed in what fits
    assert will_it_fit.describe(compose_train([*data, "data.loader=dataloader", "data.num_workers=2"]), 2, 4)[7] == 4
    assert will_it_fit.describe(compose_train(data), 2, 4)[7] == 0
    free = will_it_fit.table(10**6, 2, gib // 4, 4, gib, None, 0, None, runtime=gib // 4)[0]
    held = will_it_fit.table(10**6, 2, gib // 4, 4, gib, None, 0, None, runtime=gib // 4, workers=gib // 2)[0]
    assert free["fits"] and not held["fits"] and held["peak_bytes"] == free["peak_bytes"]


def test_dataloader_workers_are_priced_with_the_python_objects_they_may_copy(compose_train):
    """A dataset held as Python objects is priced again for each worker, as the run's own check prices it; one
    held as tensors is not."""
    import torch

    from ddp_lab.datasets.object_bytes import object_bytes
    from ddp_lab.distributed import DistEnv
    from ddp_lab.training.data import build_datasets
    from ddp_lab.training.workload import build_workload
    copies = {}
    for kind in ("python_blobs", "blobs"):
        cfg = compose_train(["model=custom", "model._target_=tests.workloads.linear", "data=custom",
                             f"data._target_=tests.workloads.{kind}", "+data.num_train=20000", "data.batch_size=64",
                             "data.loader=dataloader", "data.num_workers=2"])
        copies[kind] = will_it_fit.describe(cfg, 2, 4)[8]
        work = build_workload(cfg.data, DistEnv(0, 2, 0, torch.device("cpu"), "gloo"), 0, model=cfg.model)
        # (the run's: its rank's part of the held-out split and the list of its indices)
        assert work.loader_copies == pytest.approx(copies[kind], rel=0.01, abs=2**20 // 10)
        if kind == "python_blobs":
            train, test = build_datasets(cfg.data)
            assert copies[kind] == pytest.approx(2 * (object_bytes(train) + object_bytes(test)), rel=1e-3)
            assert copies[kind] > 2 * 2**20
    assert copies["blobs"] < 2**20 // 10


def test_the_command_line(tiny_fmnist, tmp_path, capsys):
    data = [f"data.root={tiny_fmnist}", f"data.cache_dir={tmp_path}", "trainer.amp=off"]
    will_it_fit.main(["--ranks", "2", "--memory", "2500KiB", "--batch", "1", "--runtime", "0", *data])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("model=lenet_fast: 129,068 parameters; SGD keeps 1 tensor(s) a parameter; 2 ranks")
    assert out[0].endswith("runtime 0.00 GiB")
    assert [line.split()[0] for line in out[2:6]] == list(will_it_fit.STRATEGIES)
    # DDP: 12P (1.5 MB) and a gradient-sized buffer (0.5 MB); stage 3: 6P and 7 of its largest unit (a 410 KB layer)
    assert out[-2:] == ["fits (the peak and 15% more, the estimate's error, within --memory): ddp, zero1, zero2",
                        "run the first with: sync=ddp (or flat)"]
    # a runtime of 400 KiB: stage 1's peak under the memory but within 15% of it: not said to fit
    will_it_fit.main(["--ranks", "2", "--memory", "2500KiB", "--batch", "1", "--runtime", "400k", *data])
    out = capsys.readouterr().out.splitlines()
    zero1 = out[3].split()
    assert zero1[0] == "zero1" and zero1[4] == "no"  # (said to fit before the 15% rule)
    assert out[-2:] == [
        "fits (the peak and 15% more, the estimate's error, within --memory): zero2",
        "run the first with: sync=zero sync.zero_stage=2"]
    for argv, says in ((["--memory", "lots"], "--memory 'lots': give a size with a unit"),
                       (["--memory", "1g", "--link", "fast"], "--link 'fast': give bits per second"),
                       (["--memory", "1g", "sync=zero", "sync.zero_stage=4"], "sync.zero_stage=4 must be 1, 2 or 3"),
                       (["--memory", "1g", "model=custom", "model._target_=torch.nn.Linear", "+model.in_features=8",
                         "+model.out_features=2"], "model=Linear cannot take the data's inputs"),
                       (["--memory", "1g", "model=nosuch"], "model=nosuch: no such preset; choose among custom, gpt,"),
                       (["--memory", "1g", "model.nokey=3"], "Could not override 'model.nokey': Key 'nokey' not in"),
                       (["--memory", "1g", "trainer.epochs=abc"], "Value 'abc' of type 'str' could not be converted")):
        with pytest.raises(SystemExit) as e:
            will_it_fit.main(["--ranks", "2", *argv, *data])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and err.count("\n") == 1, err
