"""vs_baseline: the table and the scaling figure from canned results; the commands it runs."""
import csv
import fcntl
import io
import json
import math
from pathlib import Path

import pytest
import torch

from ddp_lab.models.lenet import lenet
from ddp_lab.models.resnet import resnet18
from ddp_lab.telemetry import mfu
from ddp_lab.tools.bench.vs_baseline import baseline_mfu as vm
from ddp_lab.tools.bench.vs_baseline import compare, table
from ddp_lab.tools.bench.vs_baseline.runs import parse_variants, parse_worlds, plan


def result(system, rate, sec=10.0, acc=0.85, mem=700.0, repeat=0, batch=None, mfu=None):
    batch = batch or (256 if system.startswith("baseline") else 512)
    return {"system": system, "repeat": repeat, "samples_per_sec": rate, "sec_per_epoch": sec,
            "test_acc": acc, "peak_mem_mb": mem, "global_batch": batch, "mfu": mfu}


CANNED = [
    result("baseline d2l_scratch", 2000, sec=30.0, acc=0.83, mem=900, mfu=0.20),
    result("trainer 2p", 9000, sec=7.0, acc=0.89, mem=760, mfu=0.45),
    result("baseline d2l_scratch", 1800, sec=33.0, acc=0.83, mem=910, repeat=1, mfu=0.18),
    result("trainer 2p", 10000, sec=6.0, acc=0.89, mem=770, repeat=1, mfu=0.50),
    result("baseline d2l_scratch", 2200, sec=27.0, acc=0.84, mem=905, repeat=2, mfu=0.22),
    result("trainer 2p", 8000, sec=8.0, acc=0.88, mem=765, repeat=2, mfu=0.40),
]


def test_summarize_takes_medians_extremes_and_the_ratio_of_medians():
    base, trainer = table.summarize(CANNED)
    assert base == {"system": "baseline d2l_scratch", "runs": 3, "global_batch": "256",
                    "images_per_sec_median": 2000,
                    "images_per_sec_min": 1800, "images_per_sec_max": 2200, "mfu": 0.20,
                    "sec_per_epoch": 30.0,
                    "test_acc": 0.83, "peak_mem_mb_per_process": 910, "ratio": 1.0}
    assert trainer["images_per_sec_median"] == 9000
    assert (trainer["images_per_sec_min"], trainer["images_per_sec_max"]) == (8000, 10000)
    assert trainer["sec_per_epoch"] == 7.0 and trainer["test_acc"] == 0.89 and trainer["mfu"] == 0.45
    assert trainer["peak_mem_mb_per_process"] == 770
    assert trainer["ratio"] == pytest.approx(4.5)


def test_reference_can_be_named_and_must_exist():
    rows = table.summarize(CANNED, reference="trainer 2p")
    assert rows[0]["ratio"] == pytest.approx(2000 / 9000) and rows[1]["ratio"] == 1.0
    with pytest.raises(ValueError, match="no results"):
        table.summarize(CANNED, reference="trainer 4p")
    assert table.summarize([]) == []


def test_missing_memory_and_accuracy_show_as_dashes():
    rows = table.summarize([{"system": "a", "samples_per_sec": 100.0, "sec_per_epoch": 1.0,
                          "test_acc": None, "peak_mem_mb": None}])
    assert rows[0]["peak_mem_mb_per_process"] is None and rows[0]["test_acc"] is None
    assert rows[0]["mfu"] is None  # no mfu key at all (a results.json from before MFU)
    assert "| a | 1 | - | 100 | 100 | 100 | - | 1.0 | - | - | 1.00x |" in table.markdown_table(rows)


def test_an_mfu_of_nan_is_left_out_of_the_median():
    runs = [result("t", 100.0, mfu=math.nan), result("t", 120.0, mfu=0.3, repeat=1),
            result("t", 110.0, mfu=0.4, repeat=2)]
    assert table.summarize(runs)[0]["mfu"] == pytest.approx(0.35)
    assert table.summarize([result("t", 100.0, mfu=math.nan)])[0]["mfu"] is None


def test_markdown_and_csv_render_the_rows():
    rows = table.summarize(CANNED)
    md = table.markdown_table(rows).splitlines()
    assert md[0].startswith("| system | runs | global batch | images/s (median) | min | max | MFU | sec/epoch")
    assert md[1] == "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert md[2] == "| baseline d2l_scratch | 3 | 256 | 2,000 | 1,800 | 2,200 | 20.0% | 30.0 | 0.8300 | 910 | 1.00x |"
    assert md[3] == "| trainer 2p | 3 | 512 | 9,000 | 8,000 | 10,000 | 45.0% | 7.0 | 0.8900 | 770 | 4.50x |"
    parsed = list(csv.DictReader(io.StringIO(table.csv_text(rows))))
    assert [r["system"] for r in parsed] == ["baseline d2l_scratch", "trainer 2p"]
    assert float(parsed[1]["ratio"]) == pytest.approx(4.5) and float(parsed[1]["mfu"]) == 0.45
    assert list(parsed[0]) == table.COLUMNS


def test_scaling_efficiency_is_2p_over_twice_1p():
    runs = [result("trainer 1p", r) for r in (5000, 5200, 4800)] + \
           [result("trainer 2p", r) for r in (9000, 9500, 9400)]
    assert table.scaling_efficiency(runs, "trainer 1p", "trainer 2p", 1, 2) == pytest.approx(9400 / 10000)
    assert table.scaling_efficiency(runs, "trainer 1p", "trainer 2p", 1, 4) == pytest.approx(9400 / 20000)


def test_notes_give_the_ratio_and_the_efficiency():
    a = compare.parse_args(["--epochs", "10"])
    note, = table.notes_for(table.summarize(CANNED), CANNED, a)
    assert note.startswith("Trainer / baseline: 4.50x images/s, test accuracy +0.0600, "
                           "MFU 45.0% against 20.0% (")
    assert "global batch 512 against 256" in note
    # each round's trainer run against the baseline run of the same round
    assert note.endswith("Per round: 4.50x, 5.56x, 3.64x; median 4.50x.")
    runs = [result("trainer 1p", 5000), result("trainer 2p", 9500)]
    a = compare.parse_args(["--compare-world", "1,2", "--threads", "1"])
    note, = table.notes_for(table.summarize(runs), runs, a)
    assert "rate(2p) / (2 x rate(1p)) = 95.0%" in note and "256 images and 1 thread(s)" in note
    assert "Per round" not in note  # one round: nothing to pair beyond the headline


def test_paired_ratios_match_runs_by_round_whatever_their_order():
    runs = [result("trainer 2p", 9000, repeat=1), result("trainer 1p", 5000, repeat=0),
            result("trainer 1p", 4000, repeat=1), result("trainer 2p", 8000, repeat=0),
            result("trainer 2p", 7000, repeat=2)]  # round 2 has no 1p run: left out
    assert table.paired_ratios(runs, "trainer 2p", "trainer 1p") == pytest.approx([8000 / 5000, 9000 / 4000])
    a = compare.parse_args(["--compare-world", "1,2"])
    note, = table.notes_for(table.summarize(runs), runs, a)
    assert note.endswith("Per round: 80.0%, 112.5%; median 96.2%.")


def test_commands_hold_the_same_data_and_epochs(tmp_path):
    a = compare.parse_args(["--epochs", "3", "--batch", "128", "--data-root", "/data/fm", "--out", str(tmp_path),
                       "--trainer-args", "trainer.compile=true", "--baseline-args", "num_devices=1"])
    a.out = tmp_path
    systems, reference = plan(a)
    assert reference == "baseline d2l_scratch"
    (base, _, base_cmd), (trainer, _, trainer_cmd) = systems
    b, t = base_cmd(tmp_path / "b"), trainer_cmd(tmp_path / "t")
    assert b[1:3] == ["-m", "ddp_lab.tools.baselines.d2l_scratch"]
    assert {"epochs=3", "data.batch_size=128", "data.root=/data/fm", "num_devices=1",
            f"hydra.run.dir={tmp_path / 'b'}"} <= set(b)
    assert t[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert {"trainer.epochs=3", "data.root=/data/fm", "model=lenet_fast",
            "trainer.threads=1", "trainer.compile=true", f"hydra.run.dir={tmp_path / 't'}"} <= set(t)
    # the trainer keeps its own batch unless told
    assert not any(x.startswith("data.batch_size=") for x in t)
    a.trainer_batch = 256
    assert "data.batch_size=256" in plan(a)[0][1][2](tmp_path / "t")


def test_compare_world_keeps_the_per_process_batch(tmp_path):
    a = compare.parse_args(["--compare-world", "2,1", "--per-process-batch", "64"])
    systems, reference = plan(a)
    assert reference == "trainer 1p" and [s for s, _, _ in systems] == ["trainer 1p", "trainer 2p"]
    cmds = [cmd(tmp_path) for _, _, cmd in systems]
    assert "--nproc_per_node=1" in cmds[0] and "data.batch_size=64" in cmds[0]
    assert "--nproc_per_node=2" in cmds[1] and "data.batch_size=128" in cmds[1]
    with pytest.raises(SystemExit):
        parse_worlds("2")


def test_table_only_re_renders_saved_results(tmp_path, capsys):
    args = {"epochs": 10, "batch": 256, "compare_world": "", "per_process_batch": 128, "threads": 1}
    (tmp_path / "results.json").write_text(json.dumps(
        {"args": args, "reference": "baseline d2l_scratch", "results": CANNED}))
    assert compare.main(["--table-only", str(tmp_path)]) == 0
    md = Path(tmp_path / "table.md").read_text()
    assert "| trainer 2p | 3 | 512 | 9,000 |" in md and "Trainer / baseline: 4.50x" in md
    assert (tmp_path / "table.csv").read_text().startswith("system,runs,")
    assert "4.50x" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no results.json there"):
        compare.main(["--table-only", str(tmp_path / "elsewhere")])


def test_variants_add_trainer_rows_with_their_overrides(tmp_path):
    a = compare.parse_args(["--variant", "compile=trainer.compile=true", "--variant", "fp32=trainer.amp=off"])
    systems, _ = plan(a)
    assert [s for s, _, _ in systems] == ["baseline d2l_scratch", "trainer 2p", "trainer 2p compile",
                                          "trainer 2p fp32"]
    assert "trainer.compile=true" in systems[2][2](tmp_path) and "trainer.amp=off" in systems[3][2](tmp_path)
    assert "trainer.compile=true" not in systems[1][2](tmp_path)
    with pytest.raises(SystemExit):
        parse_variants(["no-overrides"])
    results = CANNED + [result("trainer 2p compile", 11000)]
    notes = table.notes_for(table.summarize(results), results, a)
    assert [n.split(":")[0] for n in notes] == ["trainer 2p / baseline", "trainer 2p compile / baseline"]
    assert "5.50x" in notes[1]


def test_a_row_with_runs_of_different_batches_shows_each():
    runs = [result("trainer 2p", 9000, batch=512), result("trainer 2p", 8000, batch=256)]
    assert table.summarize(runs)[0]["global_batch"] == "256/512"


def test_an_out_folder_with_an_earlier_run_is_refused_before_any_run(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(SystemExit, match="already holds an earlier run's files; choose another --out"):
        compare.main(["--out", str(tmp_path), "--epochs", "1", "--repeats", "1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # untouched


def test_a_run_leaves_its_record_beside_the_results(tmp_path, monkeypatch):
    def fake_run(system, repeat, cmd, run_dir, timeout):  # no subprocess: the record is what is tested
        return result(system, 9000 if system.startswith("trainer") else 2000, repeat=repeat,
                      mfu=0.45 if system.startswith("trainer") else None)

    monkeypatch.setattr(compare, "run_one", fake_run)
    monkeypatch.setattr(compare, "with_mfu", lambda r, name, threads: {**r, "mfu": 0.2})
    out = tmp_path / "out"
    assert compare.main(["--out", str(out), "--epochs", "1", "--repeats", "2"]) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["command"] == f"python -m ddp_lab.tools.bench.vs_baseline --out {out} --epochs 1 --repeats 2"
    assert record["runs"] == 4 and record["failed"] is False
    assert {"date", "machine", "git_commit", "torch", "cpu_model", "cores", "cpu_flags"} <= set(record)
    # the baseline's MFU is the benchmark's, the trainer's its own summary's
    saved = json.loads((out / "results.json").read_text())["results"]
    assert [r["mfu"] for r in saved] == [0.2, 0.45, 0.2, 0.45]
    assert "| 20.0% |" in (out / "table.md").read_text()


def test_lock_is_held_during_each_run_and_released_between(tmp_path, monkeypatch):
    lock = tmp_path / "cpu.lock"
    held = []

    def locked() -> bool:
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    def fake_run(system, repeat, cmd, run_dir, timeout):
        held.append(locked())
        return result(system, 1000, repeat=repeat)

    monkeypatch.setattr(compare, "run_one", fake_run)
    monkeypatch.setattr(compare, "with_mfu", lambda r, name, threads: (held.append(locked()), r)[1])
    assert compare.main(["--out", str(tmp_path / "out"), "--repeats", "2", "--lock", str(lock)]) == 0
    # baseline run, its MFU, trainer run; twice: every one under the lock
    assert held == [True] * 6 and not locked()


def test_a_baselines_mfu_counts_its_network_against_the_peak_of_its_threads(monkeypatch):
    calls = []

    def fake_peak(device, dtype, world_size, local_world_size, threads):
        calls.append((str(device), dtype, world_size, local_world_size, threads))
        return 2e10

    monkeypatch.setattr(mfu, "peak_for_run", fake_peak)
    lenet_flops = mfu.train_flops_per_image(lenet(num_classes=10, in_channels=1), (1, 28, 28))
    assert lenet_flops == 13_258_800  # d2l_scratch's LeNet is the chapter's, as model=lenet
    r = vm.with_mfu({"samples_per_sec": 1000.0, "device": "cpu", "test_acc": 0.8}, "d2l_scratch", 2)
    assert r["flops_per_sample"] == lenet_flops and r["peak_flops"] == 2e10 and r["test_acc"] == 0.8
    assert r["mfu"] == pytest.approx(13_258_800 * 1000 / 2e10)
    assert calls == [("cpu", torch.float32, 1, 1, 2)]
    # threads 0: torch's default, which the baseline's own process had
    assert math.isnan(vm.with_mfu({"samples_per_sec": math.nan, "device": "cpu"}, "d2l_scratch", 0)["mfu"])
    assert calls[-1][-1] == torch.get_num_threads()
    # data_parallel: d2l's ResNet-18; on GPUs, one peak per device it used
    r = vm.with_mfu({"samples_per_sec": 10.0, "device": "cuda", "num_devices": 2}, "data_parallel", 0)
    assert r["flops_per_sample"] == mfu.train_flops_per_image(resnet18(num_classes=10, in_channels=1),
                                                             (1, 28, 28))
    assert calls[-1] == ("cuda", torch.float32, 2, 2, 0)
    with pytest.raises(ValueError, match="expected d2l_scratch or data_parallel"):
        vm.baseline_model("lenet")


@pytest.mark.system
def test_a_tiny_real_run_gives_both_systems_an_mfu(tiny_fmnist, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert compare.main(["--out", str(out), "--epochs", "1", "--repeats", "1", "--batch", "64",
                    "--trainer-batch", "64", "--data-root", str(tiny_fmnist), "--timeout", "300",
                    "--baseline-args", f"data.cache_dir={cache} warmup_steps=1",
                    "--trainer-args", f"data.cache_dir={cache} trainer.warmup_steps=1 "
                                      "optim.warmup_epochs=0"]) == 0
    with open(out / "table.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["system"] for r in rows] == ["baseline d2l_scratch", "trainer 2p"]
    assert all(0 < float(r["mfu"]) < 1 for r in rows)
    header = (out / "table.md").read_text().splitlines()[0]
    assert "| max | MFU | sec/epoch |" in header
    saved = json.loads((out / "results.json").read_text())["results"]
    assert saved[0]["flops_per_sample"] == 13_258_800  # the baseline's, counted by the benchmark
    assert saved[1]["flops_per_sample"] == 10_636_800  # the trainer's lenet_fast, from its summary
