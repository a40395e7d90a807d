"""ddp_lab.tools.costmodel as a program: gradients by name, inputs, its config, the command line."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.tools import costmodel as cm
from tests.conftest import run_module
from tests.helpers.costmodel import ALPHA, BETA, GAMMA, SIZES, bench_rows, compose_costmodel, write_csv


def test_model_names_give_gradient_bytes():
    assert cm.resolve_gradient("lenet").nbytes == 129068 * 4
    assert cm.resolve_gradient("resnet18").nbytes == 11172810 * 4
    assert cm.resolve_gradient("gpt").nbytes == 834304 * 4
    # a user's model by its callable (compute then given as compute_ms.linear=...)
    assert cm.resolve_gradient("tests.workloads.linear") == cm.Gradient("linear", (8 * 32 + 32 + 32 * 4 + 4) * 4, None)
    assert cm.resolve_gradient(1000) == cm.Gradient("bytes_1000", 1000, None)
    with pytest.raises(ConfigError, match="unknown model"):
        cm.resolve_gradient("vgg")


def test_run_end_to_end_on_synthetic_csvs(tmp_path):
    a = write_csv(tmp_path / "a.csv", bench_rows("ring", cm.ring, 2) + bench_rows("builtin", cm.ring, 2)
                   + bench_rows("naive", cm.naive, 2, wrong=3))
    write_csv(tmp_path / "b.csv", bench_rows("ring", cm.ring, 4) + bench_rows("builtin", cm.ring, 4)
                   + bench_rows("naive", cm.naive, 4) + bench_rows("ring", cm.ring, 1))
    cfg = compose_costmodel([f"inputs=[{a},{tmp_path}/b*.csv]", f"gamma={GAMMA}", "params=[fitted,ib_100g]",
                    "gradients=[lenet,1000000]", "compute_ms.lenet=5", "+compute_ms.bytes_1000000=1",
                    "world_sizes=[8,64]", "plot=false"])
    lines = []
    out = cm.run(cfg, tmp_path / "run", log=lines.append)
    text = "\n".join(lines)
    assert "skipped 15 rows with wrong > 0" in text and "skipped 15 rows with world_size 1" in text
    assert "MEASURED" in text and "PREDICTED" in text and "NOMINAL" in text
    fits = out["fits"]
    assert set(fits) == {"ring", "builtin", "naive"}
    assert len(fits["naive"].points) == len(SIZES)  # the wrong p=2 rows were left out
    for f in fits.values():
        assert f.params.alpha == pytest.approx(ALPHA, rel=0.02)
        assert f.params.beta == pytest.approx(BETA, rel=0.02)
    assert out["params"]["fitted"]["tree"].source == "fit: shared"
    with open(tmp_path / "run" / "predictions.csv") as f:
        preds = list(csv.DictReader(f))
    assert len(preds) == 2 * 2 * 5 * 2  # params sets x gradients x algos x world sizes
    ring8 = next(r for r in preds if r["params"] == "fitted" and r["algo"] == "ring"
                 and r["gradient"] == "lenet" and r["world_size"] == "8")
    assert float(ring8["allreduce_s"]) == pytest.approx(cm.ring(8, 129068 * 4, ALPHA, BETA, GAMMA), rel=0.02)
    assert float(ring8["compute_s"]) == pytest.approx(5e-3)
    assert (tmp_path / "run" / "fit.csv").is_file() and (tmp_path / "run" / "fit_points.csv").is_file()
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["inputs"] == [str(a), str(tmp_path / "b.csv")]
    assert record["command"] is None  # called from Python: no command line to give
    assert {"date", "machine", "git_commit", "torch", "cpu_model", "cores", "cpu_flags"} <= set(record)
    with pytest.raises(ConfigError, match="already holds predictions.csv from an earlier run"):
        cm.run(cfg, tmp_path / "run", log=lines.append)  # a rerun never overwrites them


@pytest.mark.parametrize("overrides, message", [
    (["params=[fitted]"], "params=fitted needs measurements"),
    (["params=[ib_200g]"], "neither 'fitted' nor a preset"),
    (["inputs=[/nonexistent/x.csv]"], "is not a collectives.csv file"),
    (["params=[ib_100g]", "algos=[ring,butterfly]"], "unknown algorithm 'butterfly'"),
    (["params=[ib_100g]", "gradients=[1000]"], "compute time cannot be"),
    (["params=[ib_100g]", "gamma=-1"], "gamma=-1"),
    (["params=[ib_100g]", "world_sizes=[0]"], "world_sizes"),
    (["params=[ib_100g]", "measured_cores=0"], "measured_cores=0"),
])
def test_bad_config_is_refused_with_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cm.validate(compose_costmodel(overrides))


def test_the_configuration_guide_holds_the_cost_model_reference():
    from ddp_lab.tools.costmodel.config import markdown
    from tests.conftest import guide_reference
    assert guide_reference("ddp_lab.tools.costmodel.config") == markdown(), (
        "docs/configuration.md is out of date: paste `python -m ddp_lab.tools.costmodel.config` there")


def test_the_yaml_holds_only_the_presets_and_hydras_settings():
    yaml = (Path(cm.__file__).parents[3] / "conf" / "costmodel.yaml").read_text()
    assert [ln.split(":")[0] for ln in yaml.splitlines() if ln and not ln.startswith(("#", " "))] == [
        "defaults", "presets", "hydra"]
    assert set(compose_costmodel(["params=[ib_100g]"]).presets) == {"ib_100g", "eth_25g", "nvlink"}


def test_cli_records_its_command_line(tmp_path):
    # LeNet alone: counting ResNet-18's gradients would import torchvision (3 s here)
    r = run_module("ddp_lab.tools.costmodel", ["params=[ib_100g]", "gradients=[lenet]", "compute_ms.lenet=2",
                                         "plot=false", f"hydra.run.dir={tmp_path}"], nproc=0, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["command"] == ("python -m ddp_lab.tools.costmodel 'params=[ib_100g]' 'gradients=[lenet]' "
                                 "compute_ms.lenet=2 plot=false")
    assert record["inputs"] == [] and record["torch"] == torch.__version__


def test_cli_bad_input_exits_2_with_the_message(tmp_path):
    r = run_module("ddp_lab.tools.costmodel", ["params=[fitted]", f"hydra.run.dir={tmp_path}"], nproc=0, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "ddp_lab.tools.costmodel: error: params=fitted needs measurements" in r.stderr
    assert r.stderr.count("error") == 1


def test_presets_only(tmp_path):
    cfg = compose_costmodel(["params=[eth_25g]", "gradients=[lenet]", "compute_ms.lenet=3", "world_sizes=[8,4096]"])
    lines = []
    cm.run(cfg, tmp_path, log=lines.append)
    text = "\n".join(lines)
    assert "NOMINAL" in text and "PREDICTED" in text and "MEASURED" not in text
    assert (tmp_path / "predictions.png").is_file()
    rows = list(csv.DictReader(open(tmp_path / "predictions.csv")))
    naive = {int(r["world_size"]): float(r["allreduce_s"]) for r in rows if r["algo"] == "naive"}
    assert naive[8] == pytest.approx(cm.naive(8, 129068 * 4, 1e-5, 3.2e-10, 1.2e-10), rel=1e-4)
    assert math.isclose(naive[4096] / naive[8], 4095 / 7, rel_tol=1e-3)
