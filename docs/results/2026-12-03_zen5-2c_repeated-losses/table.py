"""The record's tables, the cost model's predictions and the plot, from runs.jsonl (run.py) and events.txt.
Usage (from the repository root): python <this folder>/table.py [KILL_EVERY [DELAY]]
events.txt: `python <this folder>/table.py --events LOGDIR` from the runs' logs (run.py's temporary folder)."""
import json
import re
import statistics
import sys
from pathlib import Path

from ddp_lab.tools.costmodel.failures import Recovery, Work, predict

HERE = Path(__file__).parent
STEPS, CKPT_EVERY, ISLANDS, TARGET = 240, 48, 3, 2.93
TIMED = re.compile(r"not committed|rejoined from a peer|resumed from|joins run|failed after other islands")

if sys.argv[1:2] == ["--events"]:  # the lines that time each recovery, from every run's log
    with open(HERE / "events.txt", "w") as out:
        for log in sorted(Path(sys.argv[2]).glob("*.log")):
            for line in open(log):
                if TIMED.search(line) and "Traceback" not in line:
                    out.write(f"{log.stem} {line.strip()[:300 if 'after it asked' in line else 150]}\n")
    sys.exit()

KILL_EVERY, DELAY = (float(sys.argv[1]) if len(sys.argv) > 1 else 45.0,
                     float(sys.argv[2]) if len(sys.argv) > 2 else 3.0)
rows = [json.loads(line) for line in open(HERE / "runs.jsonl")]
runs = {(r["mode"], r["kill"], r["rep"]): r for r in rows if r["steps"] == STEPS and r["done_s"]}  # (host 0 ended)
reps = sorted({r["rep"] for r in rows})


def events(name: str) -> list[tuple[float, str]]:
    """(seconds since the launch, line) of a run's timed lines."""
    found = []
    for line in open(HERE / "events.txt"):
        run, t, rest = line.rstrip("\n").split(" ", 2)
        if run == name:
            found.append((float(t), rest))
    return found


def start_and_step(r: dict) -> tuple[float, float]:
    """A run without losses: (its start, when it would take step 0, and a step's wall time with evaluations
    and checkpoints) from a straight line through its evaluations' times, the step's set so that
    start + STEPS x step is the run's end."""
    xs, ys = [p[1] for p in r["curve"]], [p[0] for p in r["curve"]]
    slope = statistics.linear_regression(xs, ys).slope
    start = statistics.mean(ys) - slope * statistics.mean(xs)
    return start, (r["done_s"] - start) / STEPS


def components() -> dict[str, list[float]]:
    """Each failure's parts as the lost-host runs time them: restart's detect (the loss to the job's end, DELAY
    before its launch again) and restart (that launch to its first step: the resume, then the steps to the
    next evaluation at the control's pace taken off); torchft's detect (the loss to the last survivor's
    dropped round, where one was dropped), its restart (the lost host's launch again to its heal) and heal."""
    parts = {"restart_detect": [], "restart_restart": [], "torchft_detect": [], "torchft_restart": [],
             "torchft_heal": []}
    for (mode, kill, rep), r in runs.items():
        if not kill or (mode, False, rep) not in runs:
            continue
        step_s = start_and_step(runs[(mode, False, rep)])[1]
        ev, kills = events(f"{mode}-1-{rep}"), [k["t"] for k in r["kills"]]
        if mode == "restart":
            for launch in r["launches"][1:]:
                before = [k for k in kills if k < launch]
                resumed = [(t, int(re.search(r"\(step (\d+)", line).group(1))) for t, line in ev
                           if t > launch and "[rl-0] resumed from" in line]
                after = [p for p in r["curve"] if resumed and p[0] > resumed[0][0]]
                if before and resumed and after:
                    parts["restart_detect"].append(launch - DELAY - before[-1])
                    parts["restart_restart"].append(after[0][0] - launch - (after[0][1] - resumed[0][1]) * step_s)
        else:
            for k in kills:
                dropped = [t for t, line in ev if k < t < k + 30 and "not committed" in line]
                if dropped:
                    parts["torchft_detect"].append(max(dropped) - k)
            joins = [t for t, line in ev if "joins run" in line]
            for t, line in ev:
                if "s after it asked" in line:
                    parts["torchft_heal"].append(float(re.search(r"([\d.]+) s after it asked", line).group(1)))
                    if [j for j in joins if j < t]:
                        parts["torchft_restart"].append(t - max(j for j in joins if j < t))
    return parts


PARTS = components()
MEDIAN = {k: statistics.median(v) for k, v in PARTS.items() if v}


def prediction(mode: str, rep: int, measured: bool) -> tuple[float, float | None] | None:
    """(to the end, to the target) of the lost-host run of `mode` in round `rep`: its control's start and step,
    each failure's parts at their settings (detect: the collectives' 10 s timeout; a start again as long as
    the first) or, `measured`, the medians the lost-host runs timed (MEDIAN)."""
    c = runs.get((mode, False, rep))
    if not c:
        return None
    start, step_s = start_and_step(c)
    m = MEDIAN if measured else {}
    w = Work(STEPS, step_s, start, CKPT_EVERY, islands=ISLANDS)
    r = Recovery(KILL_EVERY, periodic=True, detect_s=m.get(f"{mode}_detect", 10.0), relaunch_s=DELAY,
                 heartbeat_s=2.0, heal_s=m.get("torchft_heal", 0.5), restart_s=m.get(f"{mode}_restart"))
    end = next(o for o in predict(w, r) if o.mode == mode).wall_s
    # (the target's step in the control: its evaluation's, every 24)
    to = next(o for o in predict(w, r, c["steps_to_target"]) if o.mode == mode).wall_s \
        if c["steps_to_target"] else None
    return end, to


def useful_steps(r: dict) -> float:
    """Steps' worth of samples trained and kept: each step counts the islands present (torchft), all (restart)."""
    m = r["membership"]
    if not m:
        return float(STEPS)
    edges = [x["step"] for x in m] + [STEPS]
    return sum((b - a) * x["islands"] / ISLANDS for x, a, b in zip(m, edges, edges[1:]))


def fmt(xs, f=".1f", unit=""):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):{f}}{unit} ({min(xs):{f}} to {max(xs):{f}})" if xs else "-"


def lost(mode: str) -> list[tuple[int, dict]]:
    return [(k, runs[(mode, True, k)]) for k in reps if (mode, True, k) in runs]


print(f"| mode | losses | wall s to step {STEPS} | its control's | cost of the losses, s | useful steps/s "
      f"| s to target (val loss {TARGET}) | steps to target |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for mode in ("torchft", "restart"):
    got = lost(mode)
    ctrl = [runs[(mode, False, k)]["done_s"] for k, _ in got if (mode, False, k) in runs]
    cost = [r["done_s"] - runs[(mode, False, k)]["done_s"] for k, r in got if (mode, False, k) in runs]
    print(f"| {mode} | {fmt([sum(x['t'] < r['done_s'] for x in r['kills']) for _, r in got], '.0f')} | "
          f"{fmt([r['done_s'] for _, r in got])} | {fmt(ctrl)} | {fmt(cost)} | "
          f"{fmt([useful_steps(r) / r['done_s'] for _, r in got], '.2f')} | {fmt([r['target_s'] for _, r in got])} | "
          f"{fmt([r['steps_to_target'] for _, r in got], '.0f')} |")
    no = [runs[(mode, False, k)] for k in reps if (mode, False, k) in runs]
    print(f"| {mode}, no losses | 0 | {fmt([r['done_s'] for r in no])} | | | "
          f"{fmt([useful_steps(r) / r['done_s'] for r in no], '.2f')} | {fmt([r['target_s'] for r in no])} | "
          f"{fmt([r['steps_to_target'] for r in no], '.0f')} |")

print("\nEach failure's parts, as the lost-host runs' logs timed them (median, range, count):")
for k, v in PARTS.items():
    print(f"- {k}: {fmt(v, '.1f', ' s')}, {len(v)}")

print("\n| mode | inputs | predicted s to the end | error | predicted s to target | error |")
print("|---|---|---:|---:|---:|---:|")
for mode in ("torchft", "restart"):
    for measured in (False, True):
        got = [(k, r, prediction(mode, k, measured)) for k, r in lost(mode)]
        got = [(k, r, p) for k, r, p in got if p]
        err = [100 * (p[0] / r["done_s"] - 1) for _, r, p in got]
        terr = [100 * (p[1] / r["target_s"] - 1) for _, r, p in got if p[1] and r["target_s"]]
        print(f"| {mode} | {'parts as measured' if measured else 'settings, control'} | "
              f"{fmt([p[0] for _, _, p in got])} | {fmt(err, '+.0f', '%')} | "
              f"{fmt([p[1] for _, _, p in got if p[1]])} | {fmt(terr, '+.0f', '%')} |")

# the plot: validation loss against the wall time since the launch, the median round's runs
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rep = reps[len(reps) // 2]
fig, ax = plt.subplots(figsize=(8, 4.5))
for (mode, kill), style in {("torchft", True): "C0-", ("torchft", False): "C0:", ("restart", True): "C3-",
                            ("restart", False): "C3:"}.items():
    r = runs.get((mode, kill, rep))
    if r:
        xs, ys = [p[0] for p in r["curve"]], [p[2] for p in r["curve"]]
        ax.plot(xs, ys, style, marker=".", label=f"{mode}, " + (f"a host lost every {KILL_EVERY:g} s" if kill
                                                                 else "none lost"))
killed = runs.get(("restart", True, rep)) or runs.get(("torchft", True, rep))
for k in (killed or {}).get("kills", []):
    ax.axvline(k["t"], color="grey", lw=0.6)
ax.axhline(TARGET, color="black", lw=0.6, ls="--")
ax.set(xlabel="wall time since the launch, s (grey: a host lost)", ylabel="validation loss", ylim=(2.75, 3.6),
       title=f"GPT, DiLoCo across 3 emulated hosts at 100 Mbit/s (round {rep})")
ax.legend()
fig.tight_layout()
fig.savefig(HERE / "losses.png", dpi=80)
try:  # a 64-colour palette: a third of the bytes, the same picture
    from PIL import Image
    Image.open(HERE / "losses.png").convert("RGB").quantize(64, dither=Image.Dither.NONE).save(HERE / "losses.png",
                                                                                               optimize=True)
except ImportError:
    pass
