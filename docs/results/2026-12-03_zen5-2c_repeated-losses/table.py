"""The record's table, the cost model's predictions and the plot, from runs.jsonl (run.py).
Usage (from the repository root): python <this folder>/table.py [KILL_EVERY [DELAY]]"""
import json
import statistics
import sys
from pathlib import Path

from ddp_lab.tools.costmodel.failures import Recovery, Work, predict

HERE = Path(__file__).parent
KILL_EVERY, DELAY = (float(sys.argv[1]) if len(sys.argv) > 1 else 45.0,
                     float(sys.argv[2]) if len(sys.argv) > 2 else 3.0)
STEPS, CKPT_EVERY, ISLANDS = 240, 48, 3
rows = [json.loads(line) for line in open(HERE / "runs.jsonl")]
runs = {(r["mode"], r["kill"], r["rep"]): r for r in rows if r["rc"] == 0}
reps = sorted({r["rep"] for r in rows})


def useful_steps(r: dict) -> float:
    """Steps' worth of samples trained and kept: each step counts the islands present (torchft), all (restart)."""
    m = r["membership"]
    if not m:
        return float(STEPS)
    edges = [x["step"] for x in m] + [STEPS]
    return sum((b - a) * x["islands"] / ISLANDS for x, a, b in zip(m, edges, edges[1:]))


def fmt(xs, f=".1f"):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):{f}} ({min(xs):{f}}-{max(xs):{f}})" if xs else "-"


def pct(xs):
    return fmt([100 * x for x in xs], "+.0f").replace("(", "(").replace(")", ")") + "%" if xs else "-"


def prediction(mode: str, rep: int) -> tuple[float, float | None] | None:
    """(to the end, to the target) for the lost-host run of mode and rep, from its control's step and startup."""
    c = runs.get((mode, False, rep))
    if not c or c["first_step_s"] is None:
        return None
    step_s = (c["done_s"] - c["first_step_s"]) / STEPS
    w = Work(STEPS, step_s, c["first_step_s"], CKPT_EVERY, islands=ISLANDS)
    r = Recovery(KILL_EVERY, periodic=True, detect_s=10.0, relaunch_s=DELAY, heartbeat_s=2.0, heal_s=0.5)
    pick = {"torchft": "torchft", "restart": "restart"}[mode]
    end = next(o for o in predict(w, r) if o.mode == pick).wall_s
    to = next((o for o in predict(w, r, c["steps_to_target"]) if o.mode == pick), None) \
        if c["steps_to_target"] else None
    return end, (to.wall_s if to else None)


print("| mode | losses | wall s to step 240 | x its control | useful steps/s | predicted s | error "
      "| s to target (val loss 2.93) | steps to target | predicted s | error |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for mode in ("torchft", "restart"):
    for kill in (False, True):
        got = [runs.get((mode, kill, k)) for k in reps]
        got = [(k, r) for k, r in zip(reps, got) if r]
        ends = [r["done_s"] for _, r in got]
        ratio = [r["done_s"] / runs[(mode, False, k)]["done_s"] for k, r in got if (mode, False, k) in runs]
        good = [useful_steps(r) / r["done_s"] for _, r in got]
        kills = [sum(1 for x in r["kills"] if x["t"] < r["done_s"]) for _, r in got]
        preds = {k: prediction(mode, k) for k, _ in got} if kill else {}
        err = [preds[k][0] / r["done_s"] - 1 for k, r in got if preds.get(k)]
        terr = [preds[k][1] / r["target_s"] - 1 for k, r in got if preds.get(k) and preds[k][1] and r["target_s"]]
        print(f"| {mode}{', host lost every %gs' % KILL_EVERY if kill else ', no losses'} | "
              f"{fmt(kills, '.0f')} | {fmt(ends)} | {fmt(ratio, '.2f')} | {fmt(good, '.2f')} | "
              f"{fmt([preds[k][0] for k, _ in got if preds.get(k)])} | {pct(err)} | "
              f"{fmt([r['target_s'] for _, r in got])} | {fmt([r['steps_to_target'] for _, r in got], '.0f')} | "
              f"{fmt([preds[k][1] for k, _ in got if preds.get(k) and preds[k][1]])} | {pct(terr)} |")

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
        lost = f"a host lost every {KILL_EVERY:g} s" if kill else "none lost"
        ax.plot(xs, ys, style, marker=".", label=f"{mode}, {lost}")
killed = runs.get(("restart", True, rep)) or runs.get(("torchft", True, rep))
for k in (killed or {}).get("kills", []):
    ax.axvline(k["t"], color="grey", lw=0.6)
ax.axhline(2.93, color="black", lw=0.6, ls="--")
ax.set(xlabel="wall time since the launch, s (grey: a host lost)", ylabel="validation loss", ylim=(2.7, 3.6),
       title=f"GPT, DiLoCo across 3 emulated hosts at 100 Mbit/s (round {rep})")
ax.legend()
fig.tight_layout()
fig.savefig(HERE / "losses.png", dpi=110)
