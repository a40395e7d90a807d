"""The scaling study: efficiency arithmetic on canned points, and a short real run."""
import csv
import json

import pytest

from ddp_lab.tools.bench.scaling import Point, efficiency_rows, main, markdown_table, parse_args


def _points():
    return [Point("weak", "ddp/builtin", 1, 128, 1000.0, 0.0, 0.8, 3),
            Point("weak", "ddp/builtin", 2, 256, 1800.0, 0.1, 0.8, 3),
            Point("weak", "ddp/builtin", 4, 512, 3000.0, 0.25, 0.8, 3),
            Point("strong", "flat/ring", 2, 256, 1500.0, None, 0.8, 3),
            Point("strong", "flat/ring", 1, 256, 1000.0, None, 0.8, 3)]


def test_efficiency_is_throughput_over_n_times_one_rank():
    rows = efficiency_rows(_points())
    weak = {r["world_size"]: r for r in rows if r["kind"] == "weak"}
    assert weak[1]["efficiency"] == pytest.approx(1.0)
    assert weak[2]["efficiency"] == pytest.approx(0.9)
    assert weak[4]["efficiency"] == pytest.approx(0.75)
    assert weak[4]["samples_per_sec_per_rank"] == pytest.approx(750)
    assert weak[4]["per_rank_batch"] == 128
    strong = [r for r in rows if r["kind"] == "strong"]
    assert [r["world_size"] for r in strong] == [1, 2]  # sorted by world size
    assert strong[1]["efficiency"] == pytest.approx(0.75)
    assert strong[1]["per_rank_batch"] == 128


def test_missing_one_rank_baseline_leaves_efficiency_empty():
    rows = efficiency_rows([Point("weak", "ddp/builtin", 2, 256, 1800.0, None, 0.8, 1)])
    assert rows[0]["efficiency"] is None
    assert "| weak | ddp/builtin | 2 | 256 | 128 | 1,800 | 900 | - | - | - | 0.800 |" in markdown_table(rows)


def test_markdown_row():
    table = markdown_table(efficiency_rows(_points()))
    assert "| weak | ddp/builtin | 2 | 256 | 128 | 1,800 | 900 | - | 90% | 10% | 0.800 |" in table
    with_mfu = Point("weak", "ddp/builtin", 1, 128, 1000.0, 0.0, 0.8, 3, mfu=0.4567)
    assert "| 1,000 | 1,000 | 45.7% | 100% |" in markdown_table(efficiency_rows([with_mfu]))


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--worlds", "1,3", "--global-batch", "256"])
    assert e.value.code == 2
    assert "--global-batch=256 does not divide over [3] ranks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--syncs", "ring"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        parse_args(["--syncs", "ddp/builtin,flat/rng"])  # caught before any run is launched
    assert e.value.code == 2
    assert ("'flat/rng' is not strategy/algo with strategy one of auto, ddp, flat, per_param, powersgd, local_sgd, "
            "diloco, zero, fsdp and algo one of builtin, naive, ring") in capsys.readouterr().err


@pytest.mark.system
def test_short_real_study(tmp_path):
    rows = main(["--worlds", "1,2", "--kinds", "weak", "--max-steps", "8", "--repeats", "1",
                 "--per-rank-batch", "32", "--out", str(tmp_path),
                 "data=synthetic", "data.num_train=2048", "data.num_test=64",
                 "trainer.warmup_steps=2"])
    assert [r["world_size"] for r in rows] == [1, 2]
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["global_batch"] == 64 and rows[1]["samples_per_sec"] > 0
    with open(tmp_path / "scaling.csv") as f:
        saved = list(csv.DictReader(f))
    assert [int(r["world_size"]) for r in saved] == [1, 2]
    assert (tmp_path / "scaling.png").stat().st_size > 1000
    assert "| weak | ddp/builtin | 2 | 64 | 32 |" in (tmp_path / "scaling.md").read_text()
    # every run, the 1-rank one included, used --threads (default 1) torch threads per rank
    summaries = sorted((tmp_path / "runs").glob("*/summary.json"))
    assert len(summaries) == 2
    assert [json.loads(p.read_text())["threads"] for p in summaries] == [1, 1]
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["command"].startswith("python -m ddp_lab.tools.bench.scaling --worlds 1,2 --kinds weak")
    assert record["worlds"] == [1, 2] and record["syncs"] == ["ddp/builtin"]
    assert {"date", "machine", "git_commit", "torch", "cpu_model", "cores", "cpu_flags"} <= set(record)


def test_hydra_flags_go_before_the_overrides():
    from ddp_lab.tools.bench.trainer_runs import flags_first
    assert flags_first(["sync=ddp", "--config-dir", "my/conf", "model=mlp", "--config-name=train"]) == [
        "--config-dir", "my/conf", "--config-name=train", "sync=ddp", "model=mlp"]
