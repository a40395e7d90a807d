"""link_share: busbw over the link and over what each algorithm's formula allows, on canned sweeps."""
import csv
import json

import pytest

from ddp_lab.tools.bench import link_share as ls
from ddp_lab.tools.bench.collectives.output import write_rows


def sweep(folder, world, rows):
    folder.mkdir(parents=True)
    write_rows([{"algo": a, "size_bytes": n, "count": n // 4, "dtype": "float32", "world_size": world,
                 "time_us": 1.0, "algbw_gbps": 0.0, "busbw_gbps": b, "wrong": 0} for a, n, b in rows],
               folder / "collectives.csv")
    return folder


def test_what_each_formula_allows():
    m = 2 ** 22
    assert ls.allowed_share("ring", 8, m) == pytest.approx(1.0)
    assert ls.allowed_share("builtin", 3, m) == pytest.approx(1.0)
    assert ls.allowed_share("halving_doubling", 4, m) == pytest.approx(1.0)
    # 3 ranks: 2 of them run the 2-rank algorithm (N bytes), after a fold-in and before a fold-out
    # of the whole message (N each): 4/3 N of busbw over 3 N of link time
    assert ls.allowed_share("halving_doubling", 3, m) == pytest.approx((4 / 3) / 3)
    for p in (2, 4, 8):  # naive: the root's link carries every message, both ways
        assert ls.allowed_share("naive", p, m) == pytest.approx(1 / p)


def test_table_and_files(tmp_path, capsys):
    gb = 125_000_000 / 1e9  # 1 Gbit/s in GB/s
    a = sweep(tmp_path / "2h", 2, [("ring", 2 ** 20, 0.5 * gb), ("ring", 2 ** 22, 0.95 * gb),
                                    ("ring", 2 ** 24, 0.97 * gb), ("naive", 2 ** 24, 0.45 * gb)])
    b = sweep(tmp_path / "4h", 4, [("ring", 2 ** 22, 0.92 * gb), ("naive", 2 ** 22, 0.24 * gb),
                                    ("tree", 2 ** 22, 0.1 * gb), ("bogus", 2 ** 22, 0.1)])  # bogus: no formula
    out = tmp_path / "out"
    assert ls.main(["--rate", "1gbit", str(a), str(b / "collectives.csv"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "link_share.csv")))
    assert [(r["algo"], r["world_size"], r["size_bytes"]) for r in rows] == [
        ("naive", "2", str(2 ** 24)), ("naive", "4", str(2 ** 22)),
        ("ring", "2", str(2 ** 22)), ("ring", "2", str(2 ** 24)), ("ring", "4", str(2 ** 22)),
        ("tree", "4", str(2 ** 22))]  # from 4 MiB up
    naive4 = rows[1]
    assert float(naive4["of_link"]) == pytest.approx(0.24) and float(naive4["of_allowed"]) == pytest.approx(0.96)
    md = (out / "link_share.md").read_text()
    assert "| algo | 2 ranks | 4 ranks |" in md
    assert "| ring | 95% (0.97) | 92% (0.92) |" in md  # the smallest from 4 MiB; the largest size's share
    assert "| naive | 90% (0.45) | 96% (0.24) |" in md
    assert "| tree | - | 27% (0.10) |" in md  # whole message up and down a tree of depth 2: 3/8 allowed
    assert md in capsys.readouterr().out
    record = json.loads((out / "record.json").read_text())
    assert record["rate_bits"] == 10 ** 9 and record["command"].startswith("python -m ddp_lab.tools.bench.link_share")
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit, match="already holds an earlier run's files"):  # never written over
        ls.main(["--rate", "1gbit", str(a), "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written
    sweep_dir = a
    (sweep_dir / "record.json").write_text("{}")  # a sweep's own record: --out into its folder
    with pytest.raises(SystemExit, match="already holds an earlier run's files"):
        ls.main(["--rate", "1gbit", str(a), "--out", str(sweep_dir)])
    assert not (sweep_dir / "link_share.csv").exists() and (sweep_dir / "record.json").read_text() == "{}"


def test_without_out_a_new_folder_named_by_the_time(tmp_path, monkeypatch):
    a = sweep(tmp_path / "2h", 2, [("ring", 2 ** 22, 0.1)])
    monkeypatch.chdir(tmp_path)
    assert ls.main(["--rate", "1gbit", str(a)]) == 0
    (out,) = (tmp_path / "outputs" / "bench" / "link_share").iterdir()
    assert sorted(p.name for p in out.iterdir()) == ["link_share.csv", "link_share.md", "record.json"]


def test_bad_inputs_are_one_line(tmp_path, capsys):
    a = sweep(tmp_path / "2h", 2, [("ring", 2 ** 20, 0.1)])
    for args, error in [(["--rate", "fast", str(a)], "--rate 'fast': give bits per second"),
                        (["--rate", "1gbit", "--from", "big", str(a)], "--from 'big' is not a size"),
                        (["--rate", "1gbit", str(tmp_path / "none")], "no collectives.csv at"),
                        (["--rate", "1gbit", str(a)], "no measured size of 4M or more")]:
        with pytest.raises(SystemExit) as e:
            ls.main(args)
        assert e.value.code == 2 and error in capsys.readouterr().err
