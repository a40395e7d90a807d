"""The race's tables: each run against DDP's run of the same seed, and the median (range) per strategy."""
import pytest

from ddp_lab.tools.bench.race_table import by_strategy, compare, row, summary_markdown


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
