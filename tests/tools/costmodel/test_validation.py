"""The cost model checks itself on held-out world sizes, and sets 1/beta beside the link rate
and its TCP payload rate."""
from __future__ import annotations

import csv

import pytest
from hydra.errors import ConfigCompositionException

from ddp_lab.config import ConfigError
from ddp_lab.tools import costmodel as cm
from ddp_lab.tools.costmodel.validation import COLUMNS, held_out_rows, summary
from tests.helpers.costmodel import ALPHA, BETA, GAMMA, SIZES, bench_rows, compose_costmodel, write_csv


def _sweep(tmp_path, name, world, beta=BETA):
    def slower(p, n, a, b, g):  # the same formula with another beta: a "different network"
        return cm.ring(p, n, a, beta, g)
    return write_csv(tmp_path / f"{name}.csv", bench_rows("ring", slower, world)
                      + bench_rows("naive", cm.naive, world))


def test_held_out_points_of_the_fitted_formula_are_predicted_exactly():
    fit_pts = [cm.Point("ring", p, n, cm.ring(p, n, ALPHA, BETA, GAMMA)) for p in (2, 3) for n in SIZES]
    held = [cm.Point("ring", p, n, cm.ring(p, n, ALPHA, BETA, GAMMA)) for p in (4, 8) for n in SIZES]
    held.append(cm.Point("tree", 4, 4096, 1e-3))  # not fitted: not predicted
    fits = {"ring": cm.fit(fit_pts, cm.ring, GAMMA, "ring")}
    rows = held_out_rows(fits, held)
    assert len(rows) == 2 * len(SIZES) and list(rows[0]) == COLUMNS
    assert max(abs(r["rel_error"]) for r in rows) < 1e-3
    r = next(r for r in rows if (r["world_size"], r["size_bytes"]) == (8, 2 ** 20))
    assert r["measured_us"] == pytest.approx(cm.ring(8, 2 ** 20, ALPHA, BETA, GAMMA) * 1e6, rel=1e-6)
    s = summary(rows)["ring"]
    assert s["points"] == 2 * len(SIZES) and s["worlds"] == [4, 8] and s["max_large"] < 1e-3


def test_errors_are_summarised_from_1_mib_up_as_well():
    rows = [{"algo": "ring", "world_size": 4, "size_bytes": n, "predicted_us": 1.0, "measured_us": 1.0,
             "rel_error": e} for n, e in ((4096, 0.5), (2 ** 20, -0.1), (2 ** 21, 0.05), (2 ** 22, 0.2))]
    s = summary(rows)["ring"]
    assert (s["median"], s["max"]) == (pytest.approx(0.15), 0.5)
    assert (s["median_large"], s["max_large"]) == (pytest.approx(0.1), 0.2)


def test_run_writes_validation_csv_and_shows_beta_beside_the_link(tmp_path):
    fit_on = [_sweep(tmp_path, "h2", 2), _sweep(tmp_path, "h3", 3)]
    held = [_sweep(tmp_path, "h4", 4), _sweep(tmp_path, "h8", 8, beta=2 * BETA)]
    cfg = compose_costmodel([f"inputs=[{fit_on[0]},{fit_on[1]}]", f"validate=[{held[0]},{held[1]}]",
                    "link_rate=8gbit", f"gamma={GAMMA}", "gradients=[1000000]",
                    "+compute_ms.bytes_1000000=1", "world_sizes=[8]", "plot=false"])
    lines = []
    cm.run(cfg, tmp_path / "run", log=lines.append)
    text = "\n".join(lines)
    assert "ring              1/beta  1000.00 MB/s = 100.0% of the link rate" in text  # 1/BETA = 1 GB/s
    assert "(TCP payload at most 956.41 MB/s at MTU 1500)" in text  # 1448 of every 1514 bytes
    assert "HELD OUT: 60 points of world sizes [4, 8]" in text
    with open(tmp_path / "run" / "validation.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and len(rows) == 4 * len(SIZES)
    errors = {(r["algo"], int(r["world_size"]), int(r["size_bytes"])): float(r["rel_error"]) for r in rows}
    assert abs(errors[("ring", 4, 2 ** 26)]) < 1e-3 and abs(errors[("naive", 8, 2 ** 26)]) < 1e-3
    # at 8 ranks the ring ran on links half as fast: large messages take ~2x what the fit predicts
    slow = cm.ring(8, 2 ** 26, ALPHA, 2 * BETA, GAMMA)
    assert errors[("ring", 8, 2 ** 26)] == pytest.approx(cm.ring(8, 2 ** 26, ALPHA, BETA, GAMMA) / slow - 1,
                                                        abs=1e-3)  # -0.47


def test_validate_needs_the_fit_and_a_link_rate_must_parse(tmp_path):
    held = _sweep(tmp_path, "h4", 4)
    with pytest.raises(ConfigError, match="add fitted to params"):
        cm.validate(compose_costmodel(["params=[ib_100g]", f"validate=[{held}]"]))
    with pytest.raises(ConfigError, match="link_rate"):
        cm.validate(compose_costmodel([f"inputs=[{held}]", "link_rate=fast"]))
    with pytest.raises(ConfigCompositionException, match="link_mtu"):  # typed: an integer
        cm.validate(compose_costmodel([f"inputs=[{held}]", "link_rate=1gbit", "link_mtu=jumbo"]))
    with pytest.raises(ConfigError, match="link_mtu"):  # an integer tc cannot take
        cm.validate(compose_costmodel([f"inputs=[{held}]", "link_rate=1gbit", "link_mtu=100"]))
    assert cm.validate(compose_costmodel([f"inputs=[{held}]", "link_rate=1gbit", "link_mtu=9000"]))["link_mtu"] == 9000


def test_fit_min_bytes_leaves_out_what_a_token_bucket_passes_at_memory_speed(tmp_path):
    # A shaped link lets a burst through at once: messages up to 64 KiB take a
    # tenth of the formula's time. Fitted on every size the line is pulled
    # off; fitted from 1 MiB the held-out large messages are exact.
    def with_burst(p, n, a, b, g):
        t = cm.ring(p, n, a, b, g)
        return t / 10 if n <= 65536 else t
    fit_on = [write_csv(tmp_path / f"h{p}.csv", bench_rows("ring", with_burst, p)) for p in (2, 3)]
    held = write_csv(tmp_path / "h8.csv", bench_rows("ring", with_burst, 8))
    base = [f"inputs=[{fit_on[0]},{fit_on[1]}]", f"validate=[{held}]", f"gamma={GAMMA}",
            "gradients=[1000000]", "+compute_ms.bytes_1000000=1", "world_sizes=[8]", "plot=false"]
    worst = {}
    for name, extra in (("all", []), ("large", ["fit_min_bytes=1048576"])):
        lines = []
        cm.run(compose_costmodel(base + extra), tmp_path / name, log=lines.append)
        with open(tmp_path / name / "validation.csv") as f:
            worst[name] = max(abs(float(r["rel_error"])) for r in csv.DictReader(f)
                              if int(r["size_bytes"]) >= 2 ** 20)
    assert worst["large"] < 1e-3 and worst["all"] > 0.05
    assert any("of at least 1048576 bytes (fit_min_bytes)" in line for line in lines)
    with pytest.raises(ConfigError, match="fit_min_bytes=0"):
        cm.validate(compose_costmodel(base + ["fit_min_bytes=0"]))
    with pytest.raises(ConfigError, match="leaves no message to fit"):
        cm.run(compose_costmodel(base + ["fit_min_bytes=1073741824"]), tmp_path / "none", log=lambda _: None)
