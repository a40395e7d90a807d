"""The scaling study across emulated hosts, with the cost model's step time beside the measured one."""
import csv
import os

import pytest

from ddp_lab.tools.bench.scaling import COLUMNS, Point, efficiency_rows, main, parse_args
from tests.conftest import tiny_overrides
from tests.tools.cluster.conftest import namespaces_or_skip


def _fit_csv(tmp_path):
    path = tmp_path / "fit.csv"
    path.write_text("algo,points,alpha_s,beta_s_per_byte,gamma_s_per_byte,median_abs_rel_err,max_abs_rel_err\n"
                    "builtin,10,1e-4,8e-9,0,0.01,0.02\n")
    return path


def test_predicted_step_scales_compute_by_batch_and_shared_cores(tmp_path, monkeypatch):
    from ddp_lab.tools.costmodel.step_time import load_fit

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    pts = [Point("weak", "flat/builtin", w, 128 * w, 1000.0, 0.1, 0.8, 1, 10.0, "lenet", "flat/builtin")
           for w in (1, 2, 4)]
    rows = efficiency_rows(pts, load_fit(_fit_csv(tmp_path)), threads=1)
    lenet = 516_272
    ring = {w: (2 * (w - 1) * 1e-4 + 2 * (w - 1) / w * lenet * 8e-9) * 1e3 for w in (2, 4)}
    assert rows[0]["predicted_step_ms"] == pytest.approx(10.0)            # one rank: its own compute
    assert rows[1]["predicted_step_ms"] == pytest.approx(10.0 + ring[2])  # 2 ranks on 2 cores
    assert rows[2]["predicted_step_ms"] == pytest.approx(20.0 + ring[4])  # 4 ranks share 2 cores
    assert efficiency_rows(pts)[1]["predicted_step_ms"] is None           # no fit: no prediction


def _loopback_csv(tmp_path, steps):
    path = tmp_path / "loopback.csv"
    rows = [f"weak,flat/builtin,{w},{128 * w},128,,,,,,,1,{ms},\n" for w, ms in steps.items()]
    path.write_text(",".join(COLUMNS) + "\n" + "".join(rows))
    return path


def test_compute_from_a_loopback_study_is_its_step_at_as_many_ranks(tmp_path, monkeypatch):
    from ddp_lab.tools.costmodel.step_time import load_fit

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    fit = _fit_csv(tmp_path)
    loop = _loopback_csv(tmp_path, {1: 10.0, 2: 11.0, 3: 19.0})
    args = parse_args(["--hosts", "1,2,3", "--rate", "1gbit", "--kinds", "weak", "--syncs", "flat/builtin",
                       "--fit", str(fit), "--compute-from", str(loop)])
    assert args.loopback[("weak", "flat/builtin", 3, 128)] == 19.0
    pts = [Point("weak", "flat/builtin", w, 128 * w, 1000.0, 0.1, 0.8, 1, 10.0, "lenet", "flat/builtin")
           for w in (1, 2, 3)]
    rows = efficiency_rows(pts, load_fit(fit), threads=1, loopback=args.loopback)
    lenet = 516_272
    ring = {w: (2 * (w - 1) * 1e-4 + 2 * (w - 1) / w * lenet * 8e-9) * 1e3 for w in (2, 3)}
    assert [r["predicted_step_ms"] for r in rows] == pytest.approx([10.0, 11.0 + ring[2], 19.0 + ring[3]])
    # the 1-rank step scaled by ranks / cores would have priced 3 hosts' compute at 15 ms
    assert efficiency_rows(pts, load_fit(fit))[2]["predicted_step_ms"] == pytest.approx(15.0 + ring[3])


def test_compute_from_refuses_a_study_without_every_point(tmp_path, capsys):
    fit, loop = _fit_csv(tmp_path), _loopback_csv(tmp_path, {1: 10.0, 2: 11.0})
    for argv, said in (
        (["--fit", str(fit), "--compute-from", str(loop), "--hosts", "1,2,3"],
         "no step for weak flat/builtin 3 rank(s) x 128"),
        (["--compute-from", str(loop), "--hosts", "1,2"], "--compute-from needs --fit"),
        (["--fit", str(fit), "--compute-from", str(fit), "--hosts", "1,2"], "not a bench.scaling scaling.csv"),
    ):
        with pytest.raises(SystemExit) as e:
            parse_args([*argv, "--rate", "1gbit", "--kinds", "weak", "--syncs", "flat/builtin"])
        assert e.value.code == 2
        assert said in capsys.readouterr().err


def test_hosts_and_rate_go_together(capsys):
    for argv in (["--hosts", "1,2"], ["--rate", "1gbit"], ["--hosts", "1,2", "--rate", "1gb"]):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2
    assert "--rate '1gb'" in capsys.readouterr().err
    assert parse_args(["--hosts", "1,2", "--rate", "1gbit"]).worlds == [1, 2]


def test_mtu_needs_hosts_and_is_checked(capsys):
    for argv, said in ((["--mtu", "9000"], "--mtu sets the emulated hosts' links"),
                       (["--hosts", "1,2", "--rate", "1gbit", "--mtu", "100"], "--mtu '100'")):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert parse_args(["--hosts", "1,2", "--rate", "1gbit"]).mtu == 1500
    assert parse_args(["--hosts", "1,2", "--rate", "1gbit", "--mtu", "9000"]).mtu == 9000


@pytest.mark.system
def test_a_short_study_on_two_emulated_hosts(tiny_fmnist, tmp_path):
    namespaces_or_skip()
    overrides = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "x") if not o.startswith("hydra.")]
    rows = main(["--hosts", "1,2", "--rate", "1gbit", "--kinds", "weak", "--max-steps", "6",
                 "--repeats", "1", "--per-rank-batch", "32", "--syncs", "flat/builtin",
                 "--fit", str(_fit_csv(tmp_path)), "--out", str(tmp_path / "out"), "--",
                 *overrides, "trainer.amp=off"])
    assert [r["world_size"] for r in rows] == [1, 2]
    assert all(r["step_ms"] > 0 for r in rows) and rows[1]["predicted_step_ms"] > rows[0]["step_ms"]
    with open(tmp_path / "out" / "scaling.csv") as f:
        assert [r["world_size"] for r in csv.DictReader(f)] == ["1", "2"]
    assert not [p for p in os.listdir("/run/netns") if p.startswith("ddplab-scaling")]  # removed
