"""The race to a target: the cost model's pricing on canned rows, refusals, and a short real race."""
import csv
import json

import pytest

from ddp_lab.tools.bench.time_to_accuracy import main, parse_args, preflight
from ddp_lab.tools.costmodel.formulas import Params
from ddp_lab.tools.costmodel.strategies import by_rate, time_to_target_s
from tests.conftest import tiny_overrides

LINK = Params(alpha=1e-4, beta=8e-8, gamma=0.0)  # about 100 Mbit/s, 0.1 ms a message


def test_the_link_adds_its_all_reduce_per_step_to_the_loopback_time():
    b = 516_272  # LeNet's gradients, bytes
    ring4 = 2 * 3 * 1e-4 + 2 * 3 / 4 * b * 8e-8  # one all-reduce on 4 ranks, seconds
    row = {"steps_to_target": "400", "time_to_target_s": "100.0", "wire_bytes_per_step": str(b), "every": "1"}
    assert time_to_target_s(row, LINK, 4) == pytest.approx(100.0 + 400 * ring4)
    # every 8 steps the whole weights: the bytes per step are an eighth, the messages too
    every8 = {**row, "wire_bytes_per_step": str(b / 8), "every": "8"}
    assert time_to_target_s(every8, LINK, 4) == pytest.approx(100.0 + 400 * ring4 / 8)
    assert time_to_target_s({**row, "time_to_target_s": ""}, LINK, 4) is None  # missed the target
    # at ten times the rate the bytes cost a tenth; the messages the same
    fast = by_rate({"ddp": [row]}, LINK, 100_000_000, 4, [100_000_000, 1_000_000_000])["ddp"]
    assert fast[0] == pytest.approx(100.0 + 400 * ring4)
    assert fast[1] == pytest.approx(100.0 + 400 * (2 * 3 * 1e-4 + 2 * 3 / 4 * b * 8e-9))


def test_the_bytes_sent_up_to_the_target_are_priced_not_the_run_average():
    # PowerSGD: 100 plain steps of b, then 212 compressed of c; the run's average is lower than the
    # average up to a target reached at step 312 only if later steps are cheaper: price what was sent
    b, c = 516_272, 14_000
    sent = 100 * b + 212 * c
    row = {"steps_to_target": "312", "time_to_target_s": "50.0", "wire_bytes_per_step": "20000", "every": "1",
           "wire_bytes_to_target": str(sent)}
    per_call = 2 * 3 * 1e-4  # 312 all-reduces' latency on 4 ranks, and 2(N-1)/N of the bytes at beta
    assert time_to_target_s(row, LINK, 4) == pytest.approx(50.0 + 312 * per_call + 2 * 3 / 4 * sent * 8e-8)
    # DiLoCo every 8: 40 synchronisations of what it sent
    row8 = {**row, "steps_to_target": "320", "every": "8", "wire_bytes_to_target": str(40 * b)}
    assert time_to_target_s(row8, LINK, 4) == pytest.approx(50.0 + 40 * (per_call + 2 * 3 / 4 * b * 8e-8))
    # several seeds on loopback: by_rate gives their median
    runs = [{**row, "time_to_target_s": t} for t in ("40.0", "50.0", "70.0")]
    assert by_rate({"powersgd": runs}, LINK, 100_000_000, 4, [100_000_000])["powersgd"] == [
        pytest.approx(time_to_target_s(row, LINK, 4))]


def test_every_collective_up_to_the_target_pays_the_links_latency():
    # PowerSGD on a 2-bucket model: 312 steps, 2 plain (2 all-reduces each), 310 compressed (6 each)
    sent, calls = 100_000_000, 2 * 2 + 310 * 6
    row = {"steps_to_target": "312", "time_to_target_s": "50.0", "wire_bytes_per_step": "0", "every": "1",
           "wire_bytes_to_target": str(sent), "collectives_to_target": str(calls)}
    latency = 2 * 3 * 1e-4  # a ring all-reduce's on 4 ranks
    assert time_to_target_s(row, LINK, 4) == pytest.approx(50.0 + calls * latency + 2 * 3 / 4 * sent * 8e-8)
    # DiLoCo in 4 bits every 8: two collectives a synchronisation (an all-to-all, an all-gather)
    row8 = {**row, "steps_to_target": "320", "every": "8", "collectives_to_target": "80"}
    assert time_to_target_s(row8, LINK, 4) == pytest.approx(50.0 + 80 * latency + 2 * 3 / 4 * sent * 8e-8)
    # a race.csv from before they were counted: one a synchronisation
    assert time_to_target_s({**row8, "collectives_to_target": ""}, LINK, 4) == pytest.approx(
        50.0 + 40 * latency + 2 * 3 / 4 * sent * 8e-8)


def test_a_loopback_fit_takes_the_loopback_runs_own_collectives_out_of_its_time():
    local = Params(alpha=1e-5, beta=1e-9, gamma=0.0)  # loopback: 10 us a message, 1 GB/s
    b = 516_272
    row = {"steps_to_target": "400", "time_to_target_s": "100.0", "wire_bytes_per_step": str(b), "every": "1",
           "collectives_to_target": "800"}  # two buckets a step

    def comm(on):
        return 800 * 2 * 3 * on.alpha + 400 * 2 * 3 / 4 * b * on.beta
    assert time_to_target_s(row, LINK, 4, local) == pytest.approx(100.0 - comm(local) + comm(LINK))
    assert time_to_target_s(row, LINK, 4, local) < time_to_target_s(row, LINK, 4)
    # an overlapped DiLoCo's loopback all-reduce was hidden behind its steps: nothing taken out
    over = {**row, "every": "8", "collectives_to_target": "50", "step_ms": "1000",
            "sync": "diloco/builtin(every 8, outer lr 0.7, momentum 0.5, overlap 4 mix 0.5)"}
    assert time_to_target_s(over, LINK, 4, local) == time_to_target_s(over, LINK, 4) == pytest.approx(100.0)
    # by_rate passes it on
    assert by_rate({"ddp": [row]}, LINK, 100_000_000, 4, [100_000_000], local)["ddp"] == [
        pytest.approx(time_to_target_s(row, LINK, 4, local))]


def test_diloco_overlapped_pays_only_what_its_all_reduce_takes_beyond_tau_steps():
    b = 3_337_216
    row = {"steps_to_target": "120", "time_to_target_s": "40.0", "wire_bytes_per_step": str(b / 8), "every": "8",
           "step_ms": "200", "sync": "diloco/builtin(every 8, outer lr 0.7, momentum 0.5, overlap 4 mix 0.5)"}
    per_sync = 2 * 3 * 1e-4 + 2 * 3 / 4 * b * 8e-8  # 0.40 s on 4 ranks: 4 steps of 0.2 s hide 0.8 s
    assert time_to_target_s(row, LINK, 4) == pytest.approx(40.0)
    assert time_to_target_s({**row, "step_ms": "50"}, LINK, 4) == pytest.approx(40.0 + 15 * (per_sync - 0.2))
    waits = {**row, "sync": "diloco/builtin(every 8, outer lr 0.7, momentum 0.5)"}  # no overlap: all of it
    assert time_to_target_s(waits, LINK, 4) == pytest.approx(40.0 + 15 * per_sync)
    # in 4 fragments: 60 syncs of a quarter of the bytes (0.10 s), each hidden behind 4 steps of 0.02 s but for its rest
    quarter = 2 * 3 * 1e-4 + 2 * 3 / 4 * b / 4 * 8e-8
    fragments = {**row, "step_ms": "20", "collectives_to_target": "60",
                 "sync": "diloco/builtin(every 8, outer lr 0.7, momentum 0.5, overlap 4 mix 0.5, fragments 4)"}
    assert time_to_target_s(fragments, LINK, 4) == pytest.approx(40.0 + 60 * (quarter - 0.08))
    blocking = {**fragments, "sync": "diloco/builtin(every 8, outer lr 0.7, momentum 0.5, fragments 4)"}
    assert time_to_target_s(blocking, LINK, 4) == pytest.approx(40.0 + 60 * quarter)


def test_islands_pay_only_what_crosses_between_them_on_the_link_across():
    """2 islands of 2, int4 across: each rank's chunk crossed (60 kB to the target), the island's 2 chunks at once
    over its host's link, priced as one all-reduce among 2 islands on the across fit; the inside (every step's
    DDP all-reduce, 3 MB a step) stayed on loopback, as the loopback run measured it."""
    across = Params(alpha=2e-4, beta=4e-7, gamma=0.0)
    row = {"steps_to_target": "120", "time_to_target_s": "40.0", "wire_bytes_per_step": "3400000", "every": "8",
           "wire_bytes_to_target": "408000000", "wire_bytes_across_to_target": "60000", "step_ms": "0",
           "sync": "islands(2 islands of 2: ddp/builtin inside, diloco/builtin(every 8, outer lr 0.7, momentum 0.5, "
                   "overlap 2 eager)+int4 across)"}
    per_sync = 2 * 1 * 2e-4 + 2 * 1 / 2 * (2 * 60000 / 15) * 4e-7 + 2e-4 * 2  # (+ the second call's latency)
    assert time_to_target_s(row, LINK, 4, None, across) == pytest.approx(40.0 + 15 * per_sync)
    assert time_to_target_s(row, LINK, 4) == pytest.approx(40.0 + 15 * (2 * 1e-4 + 8000 * 8e-8 + 2e-4))


def test_hsdp_pays_its_gradient_shards_across_every_step_one_latency_a_unit():
    """HSDP (sync=fsdp sync.islands=host, 2 islands of 2): each rank's shard of the gradients crossed every step
    (50 kB a rank to the target), the island's 2 shards at once, in one all-reduce a unit (5 units, 100 steps:
    500 collectives across); the reduce-scatters and gathers inside stayed on loopback."""
    across = Params(alpha=2e-4, beta=4e-7, gamma=0.0)
    row = {"steps_to_target": "100", "time_to_target_s": "30.0", "wire_bytes_per_step": "9000000", "every": "1",
           "wire_bytes_to_target": "900000000", "wire_bytes_across_to_target": "50000",
           "collectives_across_to_target": "500", "step_ms": "0", "sync": "fsdp/builtin (HSDP: 2 islands of 2)"}
    per_step = 2 * 1 * 2e-4 + 2 * 1 / 2 * (2 * 50000 / 100) * 4e-7 + 4 * (2 * 1 * 2e-4)  # (4 more latencies)
    assert time_to_target_s(row, LINK, 4, None, across) == pytest.approx(30.0 + 100 * per_step)
    flat = {**row, "sync": "fsdp/builtin"}  # (plain fsdp: every byte over the link among the 4 ranks)
    assert time_to_target_s(flat, LINK, 4, None, across) > time_to_target_s(row, LINK, 4, None, across) + 30


@pytest.mark.parametrize("argv,says", [
    (["--target-acc", "0.9"], "give --hosts N --rate R"),
    (["--ranks", "2"], "give one target"),
    (["--ranks", "2", "--target-acc", "0.9", "--strategies", "ddp,zero3"], "zero3 not among"),
    (["--hosts", "2", "--target-acc", "0.9"], "--hosts and --rate go together"),
    (["--ranks", "2", "--target-acc", "0.9", "--fit", "f.csv"], "--fit and --steps-from go together"),
    (["--ranks", "2", "--target-acc", "0.9", "--loopback-fit", "f.csv"], "--loopback-fit goes with --fit"),
    (["--ranks", "2", "--target-acc", "0.9", "--seeds", "1,x"], "--seeds 1,x: give integers"),
    (["--ranks", "2", "--target-acc", "0.9", "--seeds", "1,1"], "each seed once"),
])
def test_bad_arguments_are_refused(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("strategy,says", [
    ("diloco:sync.overlap=4:sync.algo=ring", "sync.algo=ring: DiLoCo's int8/int4, overlap and fragments run on "
                                             "torch's collectives: use sync.algo=builtin"),
    ("ddp:sync.every=4", "Could not override 'sync.every'"),  # (a key of the periodic strategies alone)
    ("local_sgd:sync.every=7", "trainer.eval_every_steps=40 must be a multiple of sync.every=7"),
    ("diloco:sync.no_such_key=1", "no_such_key"),
])
def test_a_strategy_that_cannot_run_is_refused_before_any_run_starts(tmp_path, strategy, says):
    args = parse_args(["--ranks", "2", "--target-loss", "2.8", "--eval-every", "40", "--seeds", "1,2",
                       "--strategies", f"ddp,{strategy}", "--out", str(tmp_path / "race"), "--",
                       "model=gpt", "data=text"])
    with pytest.raises(SystemExit, match=f"--strategies {strategy}: .*{says}"):
        preflight(args)
    with pytest.raises(SystemExit):
        main(["--ranks", "2", "--target-loss", "2.8", "--eval-every", "40", "--strategies", f"ddp,{strategy}",
              "--out", str(tmp_path / "race"), "--", "model=gpt", "data=text"])
    assert not (tmp_path / "race").exists()  # refused before the first run: nothing made
    preflight(parse_args(["--ranks", "2", "--target-loss", "2.8", "--eval-every", "40", "--strategies",
                          "ddp,diloco:sync.compress=int4,diloco:sync.overlap=4", "--", "model=gpt", "data=text"]))


@pytest.mark.system
def test_a_short_race_on_loopback(tiny_fmnist, tmp_path):
    """Two ranks, the tiny Fashion-MNIST (8 steps an epoch), evaluated every 2 steps, then priced
    as if on a slow link with --steps-from its own race.csv."""
    over = [o for o in tiny_overrides(tiny_fmnist, tmp_path / "unused") if not o.startswith(
        ("hydra.", "trainer.epochs"))] + ["trainer.amp=off", "trainer.compile=false"]
    rows = main(["--ranks", "2", "--target-acc", "0.5", "--epochs", "2", "--eval-every", "2",
                 "--strategies", "ddp,local_sgd:sync.every=2", "--out", str(tmp_path / "race"), *over])
    assert [r["strategy"] for r in rows] == ["ddp", "local_sgd:sync.every=2"]  # (sync.every: local_sgd's key)
    ddp, local = rows
    assert local["sync"] == "local_sgd/builtin(every 2)" and local["every"] == 2
    for r in rows:
        assert r["steps"] == 16 and r["target_reached"] and r["steps_to_target"] % 2 == 0
        assert 0 < r["time_to_target_s"] and 0 < r["final"] <= 1
    assert local["wire_bytes_per_step"] == pytest.approx(ddp["wire_bytes_per_step"] / 2)
    assert local["bytes_vs_ddp"] == pytest.approx(2.0)
    assert ddp["vs_ddp"] == 1.0
    out = tmp_path / "race"
    assert (out / "race.png").stat().st_size > 1000
    # (no --seeds)
    assert "| local_sgd:sync.every=2 | - | local_sgd/builtin(every 2) |" in (out / "race.md").read_text()
    for r in rows:  # the bytes up to the target: every step (synchronisation) sends the same here
        assert r["wire_bytes_to_target"] == pytest.approx(r["wire_bytes_per_step"] * r["steps_to_target"])
        assert 0 < r["eval_s_to_target"] <= r["eval_s"]
    record = json.loads((out / "record.json").read_text())
    assert record["command"].startswith("python -m ddp_lab.tools.bench.time_to_accuracy --ranks 2")

    fit = tmp_path / "fit.csv"
    fit.write_text("algo,points,alpha_s,beta_s_per_byte,gamma_s_per_byte,median_abs_rel_err,max_abs_rel_err\n"
                   "builtin,10,0,8e-8,0,0.01,0.02\n")
    with open(out / "race.csv") as f:
        saved = {r["strategy"]: r for r in csv.DictReader(f)}
    priced = main(["--ranks", "2", "--target-acc", "0.5", "--epochs", "2", "--eval-every", "2",
                   "--strategies", "ddp", "--fit", str(fit), "--steps-from", str(out / "race.csv"),
                   "--out", str(tmp_path / "priced"), *over])[0]
    base = saved["ddp"]
    want = float(base["time_to_target_s"]) + int(base["steps_to_target"]) * float(
        base["wire_bytes_per_step"]) * 8e-8  # 2 ranks: the ring sends 2(2-1)/2 = 1 x the bytes
    assert priced["predicted_time_to_target_s"] == pytest.approx(want)
    assert priced["prediction_error"] == pytest.approx(want / priced["time_to_target_s"] - 1)
