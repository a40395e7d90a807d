"""ddp_lab.telemetry.metrics: the console lines and summary.json where a figure was not measured."""
import json
import math

from ddp_lab.telemetry.metrics import final_line, write_json_atomic

SUMMARY = {"test_acc": 0.8, "sec_per_epoch": 2.0, "world_size": 2, "device": "cpu", "backend": "gloo"}


def test_unmeasured_figures_are_n_a_on_the_closing_line():
    assert final_line({**SUMMARY, "samples_per_sec": 1500.0, "mfu": 0.25}) == (
        "test acc 0.80, 2.0 sec/epoch, 1,500 img/s on 2 x cpu (gloo), MFU 25.0%")
    for unmeasured in (math.nan, None):  # NaN in the run, null read back from summary.json
        assert final_line({**SUMMARY, "samples_per_sec": unmeasured, "mfu": unmeasured}) == (
            "test acc 0.80, 2.0 sec/epoch, n/a img/s on 2 x cpu (gloo), MFU n/a")
    # a summary with no MFU at all (the d2l baselines'): no MFU part
    assert final_line({**SUMMARY, "samples_per_sec": 10.0}).endswith("10 img/s on 2 x cpu (gloo)")


def test_summary_json_holds_null_for_nan_and_infinity_at_any_depth(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"mfu": math.nan, "rate": 3.5, "straggler": {"rank": 1, "slowdown": math.inf},
                             "world_sizes": [[0, 2]], "ratios": [-math.inf, 1.0]})
    assert json.loads(path.read_text()) == {"mfu": None, "rate": 3.5, "straggler": {"rank": 1, "slowdown": None},
                                            "world_sizes": [[0, 2]], "ratios": [None, 1.0]}
