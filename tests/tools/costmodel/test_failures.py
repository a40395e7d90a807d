"""costmodel.failures: what lost hosts cost checkpoint-restart and torchft islands."""
from __future__ import annotations

import math

import pytest

from ddp_lab.config import ConfigError
from ddp_lab.tools.costmodel import failures as f

WORK = f.Work(steps=240, step_s=0.4, startup_s=20.0, ckpt_every=48, save_s=0.5, islands=3)
EVERY_40 = f.Recovery(mtbf_s=40.0, periodic=True, detect_s=1.0, relaunch_s=3.0, heartbeat_s=2.0, heal_s=0.5)


def test_a_restart_costs_the_launch_again_and_half_an_interval_of_steps():
    assert f.restart_cost_s(WORK, EVERY_40) == pytest.approx(1 + 3 + 20 + 24 * 0.4)
    # no checkpoints: half the run, on average, is computed again
    assert f.restart_cost_s(f.Work(240, 0.4, 20.0), EVERY_40) == pytest.approx(24 + 120 * 0.4)
    assert f.torchft_cost_s(WORK, EVERY_40) == pytest.approx(2 + 0.5)  # (the heartbeat runs while they detect)


def test_hosts_lost_on_a_schedule_are_the_losses_before_the_run_s_end():
    r = f.Recovery(mtbf_s=40.0, periodic=True)
    for w0, c, expected in ((116, 33.6, 12), (100, 23, 4), (39, 10, 0), (41, 10, 1), (200, 0.5, 5)):
        n = f.failures_within(w0, c, r)
        assert n == expected, (w0, c)
        # the n-th loss came before the run (having met n - 1) ended; the next one comes after its end
        assert (n == 0 or n * 40 < w0 + (n - 1) * c) and w0 + n * c <= (n + 1) * 40 + 1e-9, (w0, c)


def test_losses_at_random_stretch_the_run_by_one_over_one_minus_the_lost_fraction():
    r = f.Recovery(mtbf_s=100.0)
    assert f.failures_within(90.0, 10.0, r) == pytest.approx(1.0)  # W = 90 / (1 - 0.1) = 100 s: one loss
    assert math.isinf(f.failures_within(90.0, 100.0, r))  # each loss costs the time between two: it never ends


def test_restart_on_a_schedule_is_replayed_loss_by_loss():
    # a loss every 40 s, 24 s to start again: 40 steps gained between losses, a checkpoint every 48: never saved
    assert f.restart_wall_s(WORK, EVERY_40, 240)[0] == math.inf
    # a checkpoint every 24: back to step 48, 72, 96, ... 216 (each loss 16 s after the job stepped again)
    assert f.restart_wall_s(f.Work(240, 0.4, 20.0, ckpt_every=24), EVERY_40, 240) == (pytest.approx(353.6), 8)
    # a loss while the job starts costs that start: lost at 12 s of a 15 s start, stepping again at 17 s
    assert f.restart_wall_s(f.Work(10, 0.1, 15.0), f.Recovery(mtbf_s=12.0, periodic=True, detect_s=0, restart_s=5),
                            10) == (pytest.approx(18), 1)


def test_restart_and_torchft_to_the_end_and_to_a_target():
    rows = {o.mode: o for o in f.predict(WORK, EVERY_40)}
    assert rows["no failures"].wall_s == pytest.approx(116.0)
    assert rows["restart"].wall_s == math.inf
    random = {o.mode: o for o in f.predict(WORK, f.Recovery(mtbf_s=100.0, detect_s=1.0, relaunch_s=3.0))}
    assert random["restart"].wall_s == pytest.approx(116 / (1 - 33.6 / 100))  # (at random: the formula)
    ft = rows["torchft"]
    assert ft.failures == 3 and ft.wall_s == pytest.approx(116 + 3 * 2.5)  # losses at 40, 80, 120 s; ends at 123.5
    away = (3 + 20 + 0.5) / 0.4  # an island's absence in steps: its third of the batch untrained meanwhile
    assert ft.useful_steps == pytest.approx(240 - 3 * away / 3)
    assert ft.goodput == pytest.approx(ft.useful_steps / 123.5)
    # to a target at step 120 (68 s with nothing lost): one loss before it, its samples made up by more steps
    target = {o.mode: o for o in f.predict(WORK, EVERY_40, target_steps=120)}["torchft"]
    assert target.failures == 1 and target.steps == pytest.approx(120 + away / 3)
    assert target.wall_s == pytest.approx(20 + target.steps * 0.4 + 2.5)


def test_one_island_has_no_torchft_row_and_young_s_interval():
    assert [o.mode for o in f.predict(f.Work(100, 0.1, 5.0), EVERY_40)] == ["no failures", "restart"]
    assert f.young_interval_steps(f.Work(100, 0.1, 5.0, save_s=0.5), f.Recovery(mtbf_s=400.0)) == pytest.approx(200)
    assert f.young_interval_steps(f.Work(100, 0.1, 5.0), EVERY_40) is None


@pytest.mark.parametrize("argv, says", [
    (["--steps", "0"], "--steps 0: give a positive number"),
    (["--startup-s", "-1"], "--startup-s -1: give 0 or more"),
    (["--islands", "0"], "--islands 0: give the islands' count, 1 or more"),
    (["--target-step", "500"], "--target-step 500: give a step from 1 to --steps 240"),
])
def test_bad_inputs_are_refused_in_one_line(capsys, argv, says):
    base = {"--steps": "240", "--step-ms": "400", "--startup-s": "20", "--mtbf-s": "40", "--detect-s": "1"}
    args = [x for k, v in base.items() if k not in argv for x in (k, v)] + argv
    with pytest.raises(SystemExit) as e:
        f.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"ddp_lab.tools.costmodel.failures: error: {says}\n"


def test_the_command_prints_each_mode_and_says_when_restart_never_ends(capsys):
    f.main(["--steps", "240", "--step-ms", "400", "--startup-s", "20", "--mtbf-s", "30", "--detect-s", "1",
            "--ckpt-every", "48",
            "--islands", "3", "--relaunch-s", "3", "--save-s", "0.5", "--periodic"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "a failure costs restart 33.6 s, torchft's survivors 2.5 s (and 1/3 of the batch for 23.5 s)"
    assert out[3].split() == ["restart", "inf", "never", "ends:", "it", "loses", "ground", "faster", "than", "it",
                              "gains"]
    assert out[4].split()[:3] == ["torchft", "4.0", "126.0"]  # losses at 30, 60, 90, 120 s, 2.5 s each
    assert out[5] == "Young's checkpoint interval: 14 steps (sqrt(2 x 0.5 s x 30 s))"
    with pytest.raises(ConfigError):
        f.check(f.Work(1, 0.0, 0.0), EVERY_40)
