"""What lost hosts cost a run: checkpoint-restart against torchft islands, and the checkpoint interval.

    # 360 steps of 310 ms (evaluations and checkpoints included), 12 s from a launch to the first step,
    # a host lost every 40 s, a checkpoint every 48 steps, 3 islands (sync.fault_tolerance=torchft)
    python -m ddp_lab.tools.costmodel.failures --steps 360 --step-ms 310 --startup-s 12 --mtbf-s 40 \\
        --detect-s 10 --ckpt-every 48 --islands 3 --periodic

With nothing lost the run takes W0 = startup + steps x step. Each failure costs it a time c, and failures
come every MTBF seconds of wall time, lost time included:

    W = W0 + n(W) c      n(W) = W / MTBF at random (so W = W0 / (1 - c / MTBF)),
                         or the losses before the end when a host is lost every MTBF s from the launch (--periodic)

- **restart** (today's torchrun job: every host stops, the job is launched again, every rank resumes the
  newest checkpoint): c = detect + relaunch + restart + (ckpt_every / 2) x step, the last term the steps
  since that checkpoint computed again (half an interval on average). On a schedule the losses fall at
  known points of the checkpoint interval, and a loss may come while the job starts again: --periodic
  replays the run loss by loss instead (restart_wall_s).
- **torchft** islands (sync.fault_tolerance=torchft: the others go on, the lost island rejoins from a
  peer): c = max(detect, heartbeat) + heal for the survivors. The failed round's exchange is dropped, not
  its compute; the next quorum comes once the Lighthouse stops hearing the lost island (its heartbeat
  timeout, running while the survivors detect), and the heal holds one quorum while the state moves. They
  pay in samples instead: while an island is away (relaunch + restart + heal), 1/islands of each step's
  batch goes untrained, and a target takes that many steps more (progress counted in samples, as a small
  batch learns).

Young's interval minimises restart's loss: sqrt(2 x save x MTBF) of wall time between checkpoints (J. W.
Young, "A first order approximation to the optimum checkpoint interval", CACM 1974).
Measured against runs (why the medians hold and single runs do not): docs/costmodel.md, "Pricing lost hosts".
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from ddp_lab.config import ConfigError


@dataclass(frozen=True)
class Work:
    """The run without failures, and how it is launched again."""
    steps: int               # optimizer steps to the end (or to a target)
    step_s: float            # wall seconds a step with nothing lost, evaluations and checkpoints included
    startup_s: float         # the first launch to its first step
    ckpt_every: int = 0      # steps between checkpoints (0: none, a restart starts over)
    save_s: float = 0.0      # what one checkpoint adds to the step it ends (Young's interval)
    islands: int = 1         # torchft: islands of equal batch share


@dataclass(frozen=True)
class Recovery:
    """What a failure takes before the run goes on."""
    mtbf_s: float            # mean time between failures of any host
    periodic: bool = False   # a host lost every mtbf_s from the launch (a schedule), not at random
    # until every survivor acts: ~1 s where each one's connection to the lost host breaks; in a ring of 3 or more
    # a survivor may wait on another (that one failed, its connections open) the collective's whole timeout
    detect_s: float = 1.0
    relaunch_s: float = 0.0  # until the lost host (restart: the job) is launched again, e.g. a scheduler's delay
    heartbeat_s: float = 2.0  # torchft: the Lighthouse's heartbeat timeout (ddp_lab.tools.cluster's: 2 s)
    heal_s: float = 0.5      # torchft: a quorum that moves the whole state from a peer
    restart_s: float | None = None  # a launch again to its first step, the resume included (None: startup_s)


def _restart_s(w: Work, r: Recovery) -> float:
    return w.startup_s if r.restart_s is None else r.restart_s


def restart_cost_s(w: Work, r: Recovery) -> float:
    redo = w.ckpt_every / 2 if w.ckpt_every else w.steps / 2  # (no checkpoints: on average half the run again)
    return r.detect_s + r.relaunch_s + _restart_s(w, r) + redo * w.step_s


def restart_wall_s(w: Work, r: Recovery, steps: int) -> tuple[float, int]:
    """Checkpoint-restart to `steps` with a host lost every r.mtbf_s from the launch, replayed loss by loss:
    (wall seconds, losses met). Each loss sends the job back to its newest checkpoint; one that comes while the
    job starts again costs that start."""
    t, done, n = w.startup_s, 0.0, 0  # t: when the job steps again from `done`
    while True:
        loss = (n + 1) * r.mtbf_s
        end = t + (steps - done) * w.step_s
        if end <= loss:
            return end, n
        if loss > t:  # (stepping when lost: back to the newest checkpoint)
            done += (loss - t) / w.step_s
            done = math.floor(done / w.ckpt_every) * w.ckpt_every if w.ckpt_every else 0.0
        n += 1
        t = loss + r.detect_s + r.relaunch_s + _restart_s(w, r)
        if n > 10_000:
            return math.inf, n  # (each loss comes before the job steps again: it never ends)


def torchft_cost_s(w: Work, r: Recovery) -> float:
    return max(r.detect_s, r.heartbeat_s) + r.heal_s


def failures_within(w0_s: float, cost_s: float, r: Recovery) -> float:
    """n, the failures a run of w0_s (nothing lost) meets when each costs cost_s: W = w0_s + n cost_s."""
    m = r.mtbf_s
    if cost_s >= m:
        return math.inf  # (each failure loses more than the time between two: it never ends)
    if r.periodic:  # losses at m, 2m, ...: the smallest n whose next one, at (n+1) m, comes after the end
        return float(max(0, math.ceil((w0_s - m) / (m - cost_s))))
    return w0_s / (m - cost_s)  # (W / m failures in W)


@dataclass
class Outcome:
    mode: str
    wall_s: float            # to the end of the work
    failures: float          # failures met
    steps: float             # optimizer steps taken that count (torchft: with islands missing)
    useful_steps: float      # steps worth of samples trained and kept

    @property
    def goodput(self) -> float:
        """Useful steps a second."""
        return self.useful_steps / self.wall_s if self.wall_s else 0.0


def predict(w: Work, r: Recovery, target_steps: int | None = None) -> list[Outcome]:
    """Each mode's wall time to the work's end (target_steps: to a target reached at that step with nothing
    lost; torchft's untrained samples then add steps)."""
    steps = target_steps or w.steps
    w0 = w.startup_s + steps * w.step_s
    rows = [Outcome("no failures", w0, 0.0, steps, steps)]
    if r.periodic:
        wall, n = restart_wall_s(w, r, steps)
        rows.append(Outcome("restart", wall, float(n), steps, steps))
    else:
        n = failures_within(w0, restart_cost_s(w, r), r)
        rows.append(Outcome("restart", w0 + n * restart_cost_s(w, r), n, steps, steps))
    if w.islands < 2:
        return rows  # (torchft's islands go on without one of them: one island is the whole run)
    c = torchft_cost_s(w, r)
    away_steps = (r.relaunch_s + _restart_s(w, r) + r.heal_s) / w.step_s  # an island's absence, in steps
    n, extra = failures_within(w0, c, r), 0.0
    lost = min(n * away_steps, steps) / w.islands  # steps' worth of samples left untrained
    if target_steps:  # a target needs as many samples: that many steps more, and the failures in their time
        for _ in range(50):  # (a fixed point: each step more may meet another failure)
            if math.isinf(n) or abs(lost - extra) < 1e-9:
                break
            extra = lost
            n = failures_within(w0 + extra * w.step_s, c, r)
            lost = min(n * away_steps, steps + extra) / w.islands
        rows.append(Outcome("torchft", w0 + extra * w.step_s + n * c, n, steps + extra, steps))
    else:
        rows.append(Outcome("torchft", w0 + n * c, n, steps, steps - lost))
    return rows


def young_interval_steps(w: Work, r: Recovery) -> float | None:
    """Young's checkpoint interval in steps (None without a save's cost)."""
    return math.sqrt(2 * w.save_s * r.mtbf_s) / w.step_s if w.save_s > 0 else None


def check(w: Work, r: Recovery) -> None:
    for name, v in (("--steps", w.steps), ("--step-ms", w.step_s), ("--mtbf-s", r.mtbf_s)):
        if not v > 0:
            raise ConfigError(f"{name} {v:g}: give a positive number")
    for name, v in (("--startup-s", w.startup_s), ("--restart-s", r.restart_s or 0.0), ("--ckpt-every", w.ckpt_every),
                    ("--save-s", w.save_s), ("--detect-s", r.detect_s), ("--relaunch-s", r.relaunch_s),
                    ("--heartbeat-s", r.heartbeat_s), ("--heal-s", r.heal_s)):
        if v < 0:
            raise ConfigError(f"{name} {v:g}: give 0 or more")
    if w.islands < 1:
        raise ConfigError(f"--islands {w.islands}: give the islands' count, 1 or more")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.costmodel.failures",
                                description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to the end")
    p.add_argument("--step-ms", type=float, required=True, help="a step's wall time with nothing lost, "
                   "evaluations and checkpoints included (summary.json: train_s / steps)")
    p.add_argument("--startup-s", type=float, required=True, help="the first launch to its first step")
    p.add_argument("--restart-s", type=float, help="a launch again to its first step, the resume included "
                   "(default: --startup-s)")
    p.add_argument("--mtbf-s", type=float, required=True, help="mean time between failures of any host")
    p.add_argument("--periodic", action="store_true", help="a host lost every --mtbf-s from the launch")
    p.add_argument("--ckpt-every", type=int, default=0, help="steps between checkpoints (trainer.ckpt_every_steps)")
    p.add_argument("--save-s", type=float, default=0.0, help="what a checkpoint adds to its step (Young's interval)")
    p.add_argument("--islands", type=int, default=1, help="torchft islands (sync.max_islands): 2 or more "
                   "adds torchft's row")
    p.add_argument("--target-step", type=int, help="the step a target is reached at with nothing lost")
    p.add_argument("--detect-s", type=float, required=True, help="a failure until every survivor acts: the "
                   "collective's timeout at worst (dist.timeout_s; torchft: sync.island_timeout_s), ~1 s at best")
    p.add_argument("--relaunch-s", type=float, default=0.0, help="a failure until the launch again")
    p.add_argument("--heartbeat-s", type=float, default=2.0, help="torchft Lighthouse's heartbeat timeout")
    p.add_argument("--heal-s", type=float, default=0.5, help="torchft: a heal's quorum")
    a = p.parse_args(argv)
    w = Work(a.steps, a.step_ms / 1000, a.startup_s, a.ckpt_every, a.save_s, a.islands)
    r = Recovery(a.mtbf_s, a.periodic, a.detect_s, a.relaunch_s, a.heartbeat_s, a.heal_s, a.restart_s)
    try:
        check(w, r)
        if a.target_step is not None and not 0 < a.target_step <= a.steps:
            raise ConfigError(f"--target-step {a.target_step}: give a step from 1 to --steps {a.steps}")
    except ConfigError as e:
        print(f"ddp_lab.tools.costmodel.failures: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"a failure costs restart {restart_cost_s(w, r):.1f} s, torchft's survivors {torchft_cost_s(w, r):.1f} s"
          f" (and 1/{w.islands} of the batch for {r.relaunch_s + _restart_s(w, r) + r.heal_s:.1f} s)")
    what = f"to the target (step {a.target_step})" if a.target_step else f"to step {a.steps}"
    print(f"{'mode':<12} {'failures':>8} {'wall s ' + what:>28} {'x none':>7} {'useful steps/s':>15}")
    rows = predict(w, r, a.target_step)
    for o in rows:
        if math.isinf(o.wall_s):
            print(f"{o.mode:<12} {'inf':>8} {'never ends: it loses ground faster than it gains':>28}")
            continue
        print(f"{o.mode:<12} {o.failures:>8.1f} {o.wall_s:>28.1f} {o.wall_s / rows[0].wall_s:>7.2f} "
              f"{o.goodput:>15.3f}")
    interval = young_interval_steps(w, r)
    if interval is not None:
        print(f"Young's checkpoint interval: {interval:.0f} steps (sqrt(2 x {w.save_s:g} s x {r.mtbf_s:g} s))")


if __name__ == "__main__":
    main()
