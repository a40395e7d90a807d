"""Halving-doubling's schedule on 8 ranks replayed with the transfer and addition times that
../2026-11-25_zen4-2c_cluster-8-hosts-after-fix/timeline measured (4 MiB, 1 Gbit/s): does the
pairwise schedule alone, fed the measured spread of transfer times, cost what a call took?

Each step, a rank starts its exchange when it and its partner are both ready (the later of
the two), and is ready for the next step when its receive has arrived and been added. The
replay draws every transfer and addition independently from that step's measured ones
(the calls straight after a barrier left out, as timeline_summary.py does), runs 2,000 calls
back to back, and reports one call's time past the first 100; then again with every draw
at its step's median, and with the spread around the median scaled down. Last, the measured
transfers split by which partner posted first: their time against the bytes' at TCP's payload
rate.

    python docs/results/2026-11-26_zen4-2c_cluster-8-hosts-jitter/replay.py > replay.txt
"""
import json
import random
import statistics
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent / "2026-11-25_zen4-2c_cluster-8-hosts-after-fix" / "timeline"
RANKS, STEPS = 8, 6
PARTNERS = [[r ^ mask for r in range(RANKS)] for mask in (4, 2, 1, 1, 2, 4)]  # halving, then doubling
BUS_BYTES = 2 * (RANKS - 1) / RANKS * 4 * 2 ** 20  # busbw's bytes for a 4 MiB all-reduce
LINK = 125e6  # 1 Gbit/s in bytes per second
SIZES_MIB = [2, 1, 0.5, 0.5, 1, 2]  # each step's exchange at 4 MiB


def load_traces(folder: Path = TRACES) -> list:
    """Every rank's timeline: per call, per step (peer, tag, posted, sent, received, added) in ns."""
    return [json.loads((folder / f"trace-{r}.json").read_text()) for r in range(RANKS)]


def measured(traces: list) -> tuple[list[list[float]], list[list[float]]]:
    """Per step, every transfer (from the later partner's post to the receive) and addition, ms."""
    xfer = [[] for _ in range(STEPS)]
    add = [[] for _ in range(STEPS)]
    for it in range(len(traces[0])):
        if it % 4 == 0:  # straight after a barrier
            continue
        for r in range(RANKS):
            for s in range(STEPS):
                peer, _tag, posted, _sent, received, added = traces[r][it][s]
                start = max(posted, traces[peer][it][s][2])
                xfer[s].append((received - start) / 1e6)
                add[s].append((added - received) / 1e6)
    return xfer, add


def by_first_poster(traces: list) -> list[tuple[str, list[float]]]:
    """Each transfer's time over the bytes' at TCP's payload rate (ms), by how much earlier
    than its receiver the sending partner posted the step (negative: later)."""
    bins = [("sender later by > 0.5 ms", -1e9, -0.5), ("sender later by 0.05-0.5 ms", -0.5, -0.05),
            ("within 0.05 ms", -0.05, 0.05), ("sender earlier by 0.05-0.5 ms", 0.05, 0.5),
            ("sender earlier by > 0.5 ms", 0.5, 1e9)]
    found = [(name, []) for name, _, _ in bins]
    for it in range(len(traces[0])):
        if it % 4 == 0:
            continue
        for r in range(RANKS):
            for s in range(STEPS):
                peer, _tag, posted, _sent, received, _added = traces[r][it][s]
                peer_posted = traces[peer][it][s][2]
                earlier = (posted - peer_posted) / 1e6
                excess = (received - max(posted, peer_posted)) / 1e6 - SIZES_MIB[s] * 2 ** 20 / (LINK * 0.956) * 1e3
                for (name, lo, hi), (_, xs) in zip(bins, found):
                    if lo <= earlier < hi:
                        xs.append(excess)
    return found


def call_ms(draw, xfer: list, add: list, calls: int = 2000, seed: int = 0) -> float:
    """Mean time of a call, back to back, once 100 calls have set the ranks' drift; each
    transfer and addition of step s drawn by draw() from xfer[s] and add[s]."""
    random.seed(seed)
    ready, ends = [0.0] * RANKS, []
    for _ in range(calls):
        for s in range(STEPS):
            ready = [max(ready[r], ready[PARTNERS[s][r]]) + draw(xfer[s]) + draw(add[s]) for r in range(RANKS)]
        ends.append(max(ready))
    return (ends[-1] - ends[99]) / (calls - 100)


def line(what: str, ms: float) -> str:
    return f"{what}: {ms:.2f} ms a call, busbw {BUS_BYTES / (ms / 1e3) / LINK:.1%} of the link"


def main() -> None:
    traces = load_traces()
    xfer, add = measured(traces)
    print(line("as measured (timeline_summary.py, back to back)", 64.10))
    for seed in (0, 1, 2):
        print(line(f"replayed with the measured spread (seed {seed})", call_ms(random.choice, xfer, add, seed=seed)))
    for k in (0.75, 0.5, 0.25):
        def scaled(xs, k=k):
            median = statistics.median(xs)
            return median + k * (random.choice(xs) - median)
        print(line(f"replayed with {k:g}x the spread around each step's median", call_ms(scaled, xfer, add)))
    print(line("replayed with every transfer and addition at its step's median", call_ms(statistics.median, xfer, add)))
    print(line("the bytes alone at TCP's payload rate (95.6% of the link)", BUS_BYTES / (LINK * 0.956) * 1e3))
    print("transfers over the bytes' time at TCP's payload rate, by which partner posted first:")
    for name, xs in by_first_poster(traces):
        q = statistics.quantiles(xs, n=10)
        print(f"  {name}: {len(xs)} transfers, median {statistics.median(xs):+.2f} ms, p10 {q[0]:+.2f}, p90 {q[-1]:+.2f}")


if __name__ == "__main__":
    main()
