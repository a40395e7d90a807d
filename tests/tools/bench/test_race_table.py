"""The race's tables: each run against DDP's run of the same seed, and the median (range) per strategy."""
import pytest

from ddp_lab.tools.bench.race_table import COLUMNS, by_strategy, compare, diverged, markdown, row, summary_markdown


def _summary(steps, seconds, eval_s, sent, step_ms=500.0, final=2.7, sync="ddp"):
    return {"sync": sync, "world_size": 2, "target": {"loss": 2.8}, "target_reached": steps is not None,
            "steps_to_target": steps, "time_to_target_s": seconds, "eval_s_to_target": eval_s,
            "wire_bytes_to_target": sent, "wire_bytes_per_step": 1000.0, "val_loss": final,
            "step_ms": step_ms, "eval_s": 9.0, "steps": 200}


def test_each_run_is_compared_with_ddps_run_of_its_own_seed():
    rows = [row("ddp", 1, _summary(120, 100.0, 10.0, 120_000), 1, "val_loss"),
            row("diloco", 1, _summary(120, 40.0, 10.0, 15_000), 8, "val_loss"),
            row("ddp", 2, _summary(160, 200.0, 12.0, 160_000), 1, "val_loss"),
            row("diloco", 2, _summary(160, 60.0, 12.0, 20_000), 8, "val_loss"),
            row("ddp", 3, _summary(120, 110.0, 10.0, 120_000), 1, "val_loss"),
            row("diloco", 3, _summary(None, None, None, None), 8, "val_loss")]  # missed it
    compare(rows)
    assert [r.get("vs_ddp") for r in rows] == [1.0, 0.4, 1.0, 0.3, 1.0, None]
    assert rows[1]["train_to_target_s"] == 30.0 and rows[5]["train_to_target_s"] is None
    ddp, diloco = by_strategy(rows)
    assert (ddp["runs"], ddp["reached"], diloco["runs"], diloco["reached"]) == (3, 3, 3, 2)
    assert ddp["time_to_target_s"] == (110.0, 100.0, 200.0)  # (median, lowest, highest)
    assert diloco["vs_ddp"] == (pytest.approx(0.35), 0.3, 0.4)  # the median of two
    assert diloco["wire_bytes_to_target"] == (17_500.0, 15_000.0, 20_000.0)
    assert diloco["predicted_time_to_target_s"] is None
    table = summary_markdown([ddp, diloco])
    assert "| diloco | ddp | 2/3 | 140 (120-160) | 50.0 (40.0-60.0) | 39.0 (30.0-48.0) | 0.35 (0.30-0.40) |" in table


def test_a_run_the_divergence_guard_stopped_is_a_missed_target_not_a_failed_race():
    said = ("run with 4 rank(s) failed (exit 1):\n...  traceback : ddp_lab: error: training diverged: the loss is "
            "not finite at step 64 (rank 1: nan); the learning rate optim.lr=0.2 is likely too high: lower it")
    gone = diverged("diloco", 2, 4, 0.88, said)
    assert (gone["target_reached"], gone["diverged_at_step"], gone["world_size"], gone["time_to_target_s"]) == \
        (False, 64, 4, None)
    assert list(gone) == COLUMNS  # a race.csv row like any other
    rows = [row("diloco", 1, _summary(120, 40.0, 10.0, 15_000, sync="diloco/builtin(every 8)"), 8, "val_loss"),
            gone, row("ddp", 2, _summary(160, 200.0, 12.0, 160_000), 1, "val_loss")]
    compare(rows)
    assert gone.get("vs_ddp") is None
    group = by_strategy(rows)[0]
    assert (group["runs"], group["reached"], group["diverged"], group["sync"]) == (2, 1, 1, "diloco/builtin(every 8)")
    assert "| diloco | diloco/builtin(every 8) | 1/2 (1 diverged) | 120 |" in summary_markdown([group])
    assert "| diloco | 2 | - | - | - |" in markdown(rows) and "| diverged at step 64 | - |" in markdown(rows)


def test_a_seed_on_which_ddp_diverged_leaves_its_other_runs_without_a_ratio():
    ddp_gone = diverged("ddp", 2, 2, 0.88, "training diverged: the loss is not finite at step 63 (rank 0: nan)")
    local = row("local_sgd", 2, _summary(336, 17.7, 3.0, 21_000_000), 8, "val_loss")
    rows = [ddp_gone, local]
    compare(rows)  # (this raised a TypeError: DDP's bytes a step are unknown)
    assert (local.get("vs_ddp"), local.get("bytes_vs_ddp"), local["time_to_target_s"]) == (None, None, 17.7)
    assert by_strategy(rows)[0]["diverged"] == 1
