"""ddp_lab.telemetry.metrics: the console lines and summary.json where a figure was not measured."""
import json
import math

from ddp_lab.telemetry.metrics import epoch_line, final_line, write_json_atomic
from ddp_lab.training.tasks import CLASSIFICATION, REGRESSION

SUMMARY = {"test_acc": 0.8, "sec_per_epoch": 2.0, "world_size": 2, "device": "cpu", "backend": "gloo"}


def test_unmeasured_figures_are_n_a_on_the_closing_line():
    assert final_line({**SUMMARY, "samples_per_sec": 1500.0, "mfu": 0.25}) == (
        "test acc 0.80, 2.0 sec/epoch, 1,500 img/s on 2 x cpu (gloo), MFU 25.0%")
    for unmeasured in (math.nan, None):  # NaN in the run, null read back from summary.json
        assert final_line({**SUMMARY, "samples_per_sec": unmeasured, "mfu": unmeasured}) == (
            "test acc 0.80, 2.0 sec/epoch, n/a img/s on 2 x cpu (gloo), MFU n/a")
    # a summary with no MFU at all (the d2l baselines'): no MFU part
    assert final_line({**SUMMARY, "samples_per_sec": 10.0}).endswith("10 img/s on 2 x cpu (gloo)")


EPOCH = {"loss/train": 0.5, "acc/train": 0.8, "acc/test": 0.75, "loss/test": 0.25, "perf/samples_per_sec": 2000.0,
         "perf/samples_per_sec_per_rank": 1000.0, "perf/epoch_s": 3.21, "perf/step_ms": 48.25}


def test_a_run_that_max_steps_cut_counts_steps_not_epochs():
    assert epoch_line(0, 10, EPOCH, CLASSIFICATION) == (
        "epoch 1/10  loss 0.5000  train acc 0.800  test acc 0.750  2,000 img/s (1,000/rank)  3.2 s")
    assert epoch_line(0, 10, EPOCH, CLASSIFICATION, steps=(50, 50)) == (
        "step 50/50  loss 0.5000  train acc 0.800  test acc 0.750  2,000 img/s (1,000/rank)  48.2 ms/step")
    assert epoch_line(0, 10, {**EPOCH, "perf/step_ms": math.nan}, steps=(5, 5)).endswith("  n/a ms/step")
    s = {**SUMMARY, "samples_per_sec": 1500.0, "steps": 50, "step_ms": 48.25}
    assert final_line({**s, "max_steps_cut": True}) == (
        "test acc 0.80, 50 steps (trainer.max_steps), 48.2 ms/step, 1,500 img/s on 2 x cpu (gloo)")
    assert final_line({**s, "max_steps_cut": False}) == "test acc 0.80, 2.0 sec/epoch, 1,500 img/s on 2 x cpu (gloo)"


def test_a_regression_reports_its_held_out_loss():
    assert epoch_line(1, 3, EPOCH, REGRESSION) == (
        "epoch 2/3  loss 0.5000  test loss 0.2500  2,000 samples/s (1,000/rank)  3.2 s")
    assert final_line({**SUMMARY, "test_loss": 0.012345, "samples_per_sec": 900.0}, "test_loss") == (
        "test loss 0.01235, 2.0 sec/epoch, 900 samples/s on 2 x cpu (gloo)")


def test_summary_json_holds_null_for_nan_and_infinity_at_any_depth(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"mfu": math.nan, "rate": 3.5, "straggler": {"rank": 1, "slowdown": math.inf},
                             "world_sizes": [[0, 2]], "ratios": [-math.inf, 1.0]})
    assert json.loads(path.read_text()) == {"mfu": None, "rate": 3.5, "straggler": {"rank": 1, "slowdown": None},
                                            "world_sizes": [[0, 2]], "ratios": [None, 1.0]}
