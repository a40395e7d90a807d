"""ddp_lab.tools.bench.collectives: formulas, sweep sizes, validation, check pattern, a real torchrun sweep."""
from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.tools.bench.collectives import check, interleaved, output, sweep_plan
from tests.conftest import run_module


def test_algbw_and_busbw_on_known_numbers():
    # 1e9 bytes in 1 s is 1 GB/s of algorithm bandwidth
    assert sweep_plan.algbw_gbps(1e9, 1e6) == pytest.approx(1.0)
    assert sweep_plan.algbw_gbps(4096, 40.96) == pytest.approx(0.1)
    # busbw = algbw * 2(n-1)/n
    assert sweep_plan.busbw_gbps(1.0, 2) == pytest.approx(1.0)
    assert sweep_plan.busbw_gbps(1.0, 4) == pytest.approx(1.5)
    assert sweep_plan.busbw_gbps(2.0, 8) == pytest.approx(3.5)
    assert sweep_plan.busbw_gbps(1.0, 1) == 0.0


def test_message_sizes_follow_nccl_tests_b_e_f():
    assert sweep_plan.message_sizes(4096, 65536, 2) == [4096, 8192, 16384, 32768, 65536]
    assert sweep_plan.message_sizes(1000, 10000, 3) == [1000, 3000, 9000]
    assert sweep_plan.message_sizes(64, 64, 2) == [64]
    assert len(sweep_plan.message_sizes(4096, 64 << 20, 2)) == 15  # the default sweep


@pytest.mark.parametrize("dtype", list(sweep_plan.DTYPES))
@pytest.mark.parametrize("world", [2, 3, 8])
def test_check_pattern_sums_exactly_in_every_dtype(dtype, world):
    count = 4099
    bufs = []
    for r in range(world):
        b = torch.empty(count, dtype=sweep_plan.DTYPES[dtype])
        check.fill_pattern(b, r, world, dtype)
        bufs.append(b)
    assert not torch.equal(bufs[0], bufs[1])  # rank-dependent
    want = check.expected_sum(count, world, dtype, torch.device("cpu"))
    # any summation order is exact: forwards and backwards in the dtype itself
    fwd, bwd = bufs[0].clone(), bufs[-1].clone()
    for b in bufs[1:]:
        fwd += b
    for b in reversed(bufs[:-1]):
        bwd += b
    assert torch.equal(fwd, want) and torch.equal(bwd, want)


def _cfg(overrides=()):
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        return compose(config_name="bench_collectives", overrides=list(overrides))


def test_defaults_are_valid():
    p = sweep_plan.validate(_cfg())
    assert p.sizes[0] == 4096 and p.sizes[-1] == 64 << 20
    assert p.algos == ["builtin", "naive", "ring", "halving_doubling"]
    assert p.dtype == torch.float32 and p.elem_size == 4


@pytest.mark.parametrize("overrides, message", [
    (["min_bytes=8192", "max_bytes=4096"], "min_bytes=8192 is larger than max_bytes=4096"),
    (["factor=1"], "factor=1 must be >= 2"),
    (["algos=[]"], "algos=[] must be at least one algorithm"),
    (["min_bytes=4098"], "min_bytes=4098 is not a multiple of the 4-byte element size"),
    (["dtype=float64", "min_bytes=1024", "max_bytes=1028"], "max_bytes=1028 is not a multiple of the 8-byte"),
    (["iters=0"], "iters=0 must be >= 1"),
    (["min_iters=9", "iters=4"], "min_iters=9 is larger than iters=4"),
    (["time_budget_s=0"], "time_budget_s=0.0 must be a positive number of seconds"),
])
def test_bad_input_names_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sweep_plan.validate(_cfg(overrides))


@pytest.mark.parametrize("override, message", [
    ("factor=2.5", "Value '2.5' of type 'float' could not be converted to Integer"),
    ("algos=[ring,butterfly]", "Invalid value 'butterfly', expected one of [builtin, naive, ring"),
    ("dtype=int32", "Invalid value 'int32', expected one of [float32, float64, bfloat16, float16]"),
    ("mode=both", "Invalid value 'both', expected one of [sweep, interleaved]"),
    ("warmpu=5", "Could not override 'warmpu'"),
])
def test_a_wrong_type_or_choice_is_refused_when_the_config_is_composed(override, message):
    with pytest.raises(ConfigCompositionException) as e:
        _cfg([override])
    assert message in str(e.value) + str(e.value.__cause__)


def test_the_configuration_guide_holds_the_bench_reference():
    from ddp_lab.tools.bench.collectives.bench_config import markdown
    from tests.conftest import guide_reference
    assert guide_reference("ddp_lab.tools.bench.collectives.bench_config") == markdown(), (
        "docs/configuration.md is out of date: paste `python -m ddp_lab.tools.bench.collectives.bench_config` there")


def test_the_schema_holds_every_key_and_the_yaml_only_hydras_settings():
    from ddp_lab.tools.bench.collectives.bench_config import BenchCollectivesConfig
    cfg = _cfg()
    assert set(cfg) == {f.name for f in dataclasses.fields(BenchCollectivesConfig)}
    yaml = (Path(sweep_plan.__file__).parents[4] / "conf" / "bench_collectives.yaml").read_text()
    assert [ln.split(":")[0] for ln in yaml.splitlines() if ln and not ln.startswith(("#", " "))] == [
        "defaults", "hydra"]


def test_interleaved_mode_reads_its_sizes_and_always_times_builtin():
    p = sweep_plan.validate(_cfg(["mode=interleaved", "algos=[ring,ring_textbook]",
                             "interleaved.sizes=[4096,64K,1M,1.5M]"]))
    assert p.mode == "interleaved"
    assert p.sizes == [4096, 65536, 1 << 20, 3 << 19]
    assert p.algos == ["builtin", "ring", "ring_textbook"]
    assert sweep_plan.validate(_cfg(["mode=interleaved"])).sizes == [64 << 10, 1 << 20, 4 << 20, 16 << 20]


@pytest.mark.parametrize("text, size", [("4096", 4096), (4096, 4096), ("64K", 65536), ("1MiB", 1 << 20),
                                        ("2mb", 2 << 20), ("1G", 1 << 30)])
def test_parse_size(text, size):
    assert interleaved.parse_size(text) == size


@pytest.mark.parametrize("overrides, message", [
    (["mode=interleaved", "interleaved.sizes=[64Q]"], "interleaved.sizes: '64Q' is not a size in bytes"),
    (["mode=interleaved", "interleaved.sizes=[]"], "interleaved.sizes is empty"),
    (["mode=interleaved", "interleaved.sizes=[6]"], "6 bytes is not a positive multiple of the 4-byte"),
    (["mode=interleaved", "interleaved.rounds=0"], "interleaved.rounds=0 must be >= 1"),
])
def test_bad_interleaved_input_names_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sweep_plan.validate(_cfg(overrides))


@pytest.mark.system
def test_torchrun_interleaved_two_processes(tmp_path):
    algos = ["builtin", "ring", "ring_textbook", "halving_doubling_textbook"]
    r = run_module("ddp_lab.tools.bench.collectives",
                   ["mode=interleaved", "interleaved.sizes=[4K,512K]", "interleaved.rounds=3",
                    "algos=[ring,ring_textbook,halving_doubling_textbook]",
                    f"hydra.run.dir={tmp_path}"], nproc=2, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("machine tuning: gloo's threads at") == 1  # one line, from rank 0
    with open(tmp_path / "interleaved.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["algo"], int(row["size_bytes"])) for row in rows] == [
        (a, s) for s in (4096, 524288) for a in algos]
    for row in rows:
        assert int(row["wrong"]) == 0 and int(row["rounds"]) == 3 and int(row["world_size"]) == 2
        assert float(row["time_us"]) > 0 and float(row["vs_builtin"]) > 0
        calls = 20 if row["size_bytes"] == "4096" else 8000000 // 524288  # 15
        assert int(row["calls_per_block"]) == calls
    assert {float(row["vs_builtin"]) for row in rows if row["algo"] == "builtin"} == {1.0}
    assert not (tmp_path / "collectives.csv").exists()
    record = json.loads((tmp_path / "record.json").read_text())
    assert (record["mode"], record["world_size"], record["backend"]) == ("interleaved", 2, "gloo")
    assert record["command"].startswith("torchrun --nproc_per_node=2 -m ddp_lab.tools.bench.collectives "
                                        "mode=interleaved")


def test_bad_input_single_process_exits_2(tmp_path):
    r = run_module("ddp_lab.tools.bench.collectives", ["min_bytes=8192", "max_bytes=4096",
                                                 f"hydra.run.dir={tmp_path}"], nproc=0, timeout=120)
    assert r.returncode == 2
    assert "ddp_lab.tools.bench.collectives: error: min_bytes=8192 is larger than max_bytes=4096" in r.stderr
    assert not (tmp_path / "collectives.csv").exists()


@pytest.mark.system
def test_torchrun_sweep_two_processes(tmp_path):
    algos = ["builtin", "naive", "ring", "halving_doubling"]
    run_dir = tmp_path / "run"
    r = run_module("ddp_lab.tools.bench.collectives",
                   ["min_bytes=1024", "max_bytes=65536", "factor=4", "warmup=1", "iters=3",
                    "min_iters=1", f"hydra.run.dir={run_dir}"], nproc=2, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "busbw" in r.stdout and "wrong elements in total: 0 OK" in r.stdout
    with open(run_dir / "collectives.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["algo", "size_bytes", "count", "dtype", "world_size",
                                     "time_us", "algbw_gbps", "busbw_gbps", "wrong"]
        rows = list(reader)
    sizes = [1024, 4096, 16384, 65536]
    assert [(row["algo"], int(row["size_bytes"])) for row in rows] == [(a, s) for a in algos for s in sizes]
    for row in rows:
        assert int(row["wrong"]) == 0, row
        assert int(row["world_size"]) == 2 and row["dtype"] == "float32"
        assert int(row["count"]) == int(row["size_bytes"]) // 4
        t = float(row["time_us"])
        assert t > 0
        alg = float(row["algbw_gbps"])
        assert alg == pytest.approx(int(row["size_bytes"]) / t / 1e3, rel=1e-3)
        assert float(row["busbw_gbps"]) == pytest.approx(alg * 2 * (2 - 1) / 2, rel=1e-3)
    assert (run_dir / "collectives.png").stat().st_size > 0
    assert any((run_dir / "tb").iterdir())
    record = json.loads((run_dir / "record.json").read_text())
    assert record["command"] == ("torchrun --nproc_per_node=2 -m ddp_lab.tools.bench.collectives min_bytes=1024 "
                                 "max_bytes=65536 factor=4 warmup=1 iters=3 min_iters=1")
    assert (record["world_size"], record["backend"], record["torch"]) == (2, "gloo", torch.__version__)
    assert record["mode"] == "sweep"
    assert {"date", "machine", "git_commit", "cpu_model", "cores", "cpu_flags", "comm_threads"} <= set(record)
    # a second sweep into the same directory stops, every rank, and keeps the first one's CSV
    before = (run_dir / "collectives.csv").read_bytes()
    r = run_module("ddp_lab.tools.bench.collectives", ["max_bytes=4096", f"hydra.run.dir={run_dir}"],
                   nproc=2, timeout=120)
    assert r.returncode != 0
    assert "already holds collectives.csv from an earlier sweep" in r.stderr
    assert (run_dir / "collectives.csv").read_bytes() == before


@pytest.mark.system
def test_torchrun_bad_input_fails_every_rank_quickly(tmp_path):
    r = run_module("ddp_lab.tools.bench.collectives", ["algos=[ring,butterfly]", f"hydra.run.dir={tmp_path}"],
                   nproc=2, timeout=120)
    assert r.returncode != 0
    assert "Invalid value 'butterfly', expected one of [builtin, naive, ring" in r.stderr + r.stdout


def test_median_of_runs(tmp_path):
    def run(times):
        rows = [{"algo": "ring", "size_bytes": 4096, "count": 1024, "dtype": "float32", "world_size": 2,
                 "time_us": t, "algbw_gbps": 0, "busbw_gbps": 0, "wrong": w} for t, w in times]
        return output.write_rows(rows, tmp_path / f"{len(list(tmp_path.iterdir()))}.csv")

    paths = [run([(10.0, 0)]), run([(40.0, 0)]), run([(20.0, 2)])]
    (row,) = output.median_of_runs(paths)
    assert row["time_us"] == 20.0 and row["wrong"] == 2
    assert row["algbw_gbps"] == pytest.approx(4096 / 20.0 / 1e3, rel=1e-5)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"], rel=1e-5)  # 2(n-1)/n = 1 at n = 2


# ------------------------------------------- collective=reduce_scatter | all_gather
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_busbw_of_all_reduces_halves_is_n_minus_1_over_n(collective):
    # nccl-tests' doc/PERFORMANCE.md: (n-1)/n for ReduceScatter and AllGather, of the whole buffer
    assert sweep_plan.busbw_gbps(1.0, 2, collective) == pytest.approx(0.5)
    assert sweep_plan.busbw_gbps(1.0, 4, collective) == pytest.approx(0.75)
    assert sweep_plan.busbw_gbps(2.0, 8, collective) == pytest.approx(1.75)
    assert sweep_plan.busbw_gbps(1.0, 1, collective) == 0.0
    assert sweep_plan.busbw_gbps(1.0, 4) == sweep_plan.busbw_gbps(1.0, 4, "all_reduce") == pytest.approx(1.5)


def test_chunked_sizes_round_down_to_whole_chunks_and_say_so():
    assert sweep_plan.chunked_sizes([4096, 8192], 2, 4, "reduce_scatter") == ([4096, 8192], "")
    assert sweep_plan.chunked_sizes([4098, 6], 3, 2, "all_reduce") == ([4098, 6], "")  # all_reduce: as asked
    assert sweep_plan.chunked_sizes([1028, 6], 1, 2, "all_gather") == ([1028, 6], "")  # one rank: whole already
    sizes, note = sweep_plan.chunked_sizes([4, 16, 24, 64, 4096], 3, 4, "all_gather")
    assert sizes == [12, 24, 60, 4092]
    assert note == ("sizes rounded down to a multiple of world_size 3 x 4 B = 12 B: 4 skipped, 16 -> 12, "
                    "64 -> 60, 4096 -> 4092")
    sizes, note = sweep_plan.chunked_sizes([12, 16], 3, 4, "reduce_scatter")
    assert sizes == [12] and note.endswith("16 -> 12 (a repeat) skipped")
    with pytest.raises(ConfigError, match="collective=reduce_scatter at world_size 4 needs sizes of at least 16"):
        sweep_plan.chunked_sizes([4, 8], 4, 4, "reduce_scatter")


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_take_builtin_ring_textbook_and_direct(collective):
    p = sweep_plan.validate(_cfg([f"collective={collective}"]))  # the default algos: the three it has
    assert (p.collective, p.algos) == (collective, ["builtin", "ring_textbook", "direct"])
    p = sweep_plan.validate(_cfg([f"collective={collective}", "algos=[ring_textbook]"]))
    assert p.algos == ["ring_textbook"] and p.busbw_factor(4) == pytest.approx(0.75)
    p = sweep_plan.validate(_cfg([f"collective={collective}", "mode=interleaved", "algos=[ring_textbook]"]))
    assert p.algos == ["builtin", "ring_textbook"]
    assert sweep_plan.validate(_cfg()).collective == "all_reduce"


@pytest.mark.parametrize("overrides, message", [
    (["collective=reduce_scatter", "algos=[builtin,ring]"],
     "algos: ring has no reduce-scatter (collective=reduce_scatter); choose among builtin, ring_textbook, "
     "direct, e.g. 'algos=[builtin,ring_textbook,direct]'"),
    (["collective=all_gather", "algos=[naive,ring_textbook,halving_doubling_textbook]"],
     "algos: naive, halving_doubling_textbook have no all-gather (collective=all_gather)"),
    (["collective=all_gather", "mode=interleaved", "algos=[halving_doubling]"],
     "algos: halving_doubling has no all-gather"),
])
def test_an_algorithm_without_the_collective_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        sweep_plan.validate(_cfg(overrides))
    assert "\n" not in str(e.value)


def test_an_unknown_collective_is_refused_when_the_config_is_composed():
    with pytest.raises(ConfigCompositionException) as e:
        _cfg(["collective=broadcast"])
    assert "Invalid value 'broadcast', expected one of [all_reduce, reduce_scatter, all_gather]" in (
        str(e.value) + str(e.value.__cause__))


@pytest.mark.parametrize("dtype", list(sweep_plan.DTYPES))
@pytest.mark.parametrize("world", [2, 3])
def test_check_of_reduce_scatter_and_all_gather_is_exact(dtype, world):
    count, dev = 6 * 7, torch.device("cpu")
    c = count // world
    inputs = {}
    for collective in ("reduce_scatter", "all_gather"):
        inputs[collective] = []
        for r in range(world):
            b = torch.empty(count, dtype=sweep_plan.DTYPES[dtype])
            check.fill_input(b, collective, r, world, dtype)
            inputs[collective].append(b)
    total = inputs["reduce_scatter"][0].clone()
    for b in inputs["reduce_scatter"][1:]:
        total += b
    gathered = torch.cat([b[r * c:(r + 1) * c] for r, b in enumerate(inputs["all_gather"])])
    for r in range(world):
        want = check.expected("reduce_scatter", count, r, world, dtype, dev)
        assert torch.equal(want, total[r * c:(r + 1) * c])
        want = check.expected("all_gather", count, r, world, dtype, dev)
        assert torch.equal(want, gathered)
        # before the all-gather, the chunks of the others are not there: all of them wrong
        assert int((inputs["all_gather"][r] != want).sum()) == count - c


def _sweep_rows(tmp_path, collective, sizes_args):
    run_dir = tmp_path / "run"
    r = run_module("ddp_lab.tools.bench.collectives",
                   [f"collective={collective}", *sizes_args, "warmup=1", "iters=3", "min_iters=1",
                    "plot=false", "tensorboard=false", f"hydra.run.dir={run_dir}"], nproc=2, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "wrong elements in total: 0 OK" in r.stdout
    with open(run_dir / "collectives.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == [*output.CSV_COLUMNS, "collective"]
        rows = list(reader)
    for row in rows:
        assert int(row["wrong"]) == 0, row
        assert row["collective"] == collective and int(row["world_size"]) == 2
        assert int(row["count"]) == int(row["size_bytes"]) // 4 and int(row["size_bytes"]) % 8 == 0
        alg = float(row["algbw_gbps"])
        assert alg == pytest.approx(int(row["size_bytes"]) / float(row["time_us"]) / 1e3, rel=1e-3)
        assert float(row["busbw_gbps"]) / alg == pytest.approx((2 - 1) / 2, rel=1e-3)
    assert json.loads((run_dir / "record.json").read_text())["collective"] == collective
    return r, rows


@pytest.mark.system
def test_torchrun_reduce_scatter_two_processes(tmp_path):
    # 1028 B is not a multiple of 2 ranks x 4 B: rounded down to 1024, and said
    r, rows = _sweep_rows(tmp_path, "reduce_scatter", ["min_bytes=1028", "max_bytes=70000", "factor=4"])
    assert "# sizes rounded down to a multiple of world_size 2 x 4 B = 8 B: 1028 -> 1024" in r.stdout
    assert [(row["algo"], int(row["size_bytes"])) for row in rows] == [
        (a, s) for a in ("builtin", "ring_textbook", "direct") for s in (1024, 4112, 16448, 65792)]


@pytest.mark.system
def test_torchrun_all_gather_two_processes(tmp_path):
    r, rows = _sweep_rows(tmp_path, "all_gather", ["min_bytes=1024", "max_bytes=65536", "factor=4"])
    assert "rounded down" not in r.stdout
    assert [(row["algo"], int(row["size_bytes"])) for row in rows] == [
        (a, s) for a in ("builtin", "ring_textbook", "direct") for s in (1024, 4096, 16384, 65536)]


def test_a_collective_the_algorithm_lacks_exits_2_with_one_line(tmp_path):
    r = run_module("ddp_lab.tools.bench.collectives", ["collective=all_gather", "algos=[builtin,naive]",
                                                 f"hydra.run.dir={tmp_path}"], nproc=0, timeout=120)
    assert r.returncode == 2
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert errors == ["ddp_lab.tools.bench.collectives: error: algos: naive has no all-gather (collective=all_gather); "
                      "choose among builtin, ring_textbook, direct, e.g. 'algos=[builtin,ring_textbook,direct]'"]
    assert not (tmp_path / "collectives.csv").exists()
