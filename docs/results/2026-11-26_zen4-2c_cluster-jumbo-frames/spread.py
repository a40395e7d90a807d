"""How much halving-doubling's transfers spread at MTU 1500 and 9000, and what that costs a call.

Reads timeline-mtu<MTU>-<round>/ (8 hosts on 1 Gbit/s, 4 MiB; the after-fix
record's timeline.py) and, per MTU, with every round's calls pooled: each
step's transfer times (from the later partner's post to the receive)
against the bytes' time at TCP's payload rate for that MTU, their spread
(10th to 90th percentile), and the jitter record's replay of the pairwise
schedule with the transfers and additions drawn from these (seed 0) and
with every one at its step's median: the difference is what the spread
costs a call.

    python docs/results/2026-11-26_zen4-2c_cluster-jumbo-frames/spread.py FOLDER > spread.txt
    python .../spread.py FOLDER 1500    # one MTU only
"""
import importlib.util
import random
import statistics
import sys
from pathlib import Path

from ddp_lab.cluster.shaping import tcp_payload_share

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "replay", HERE.parent / "2026-11-26_zen4-2c_cluster-8-hosts-jitter" / "replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)


def pooled(folders: list[Path]) -> tuple[list[list[float]], list[list[float]]]:
    xfer, add = [[] for _ in range(replay.STEPS)], [[] for _ in range(replay.STEPS)]
    for folder in folders:
        x, a = replay.measured(replay.load_traces(folder))
        for s in range(replay.STEPS):
            xfer[s] += x[s]
            add[s] += a[s]
    return xfer, add


def main(folder: Path, mtus: tuple = (1500, 9000)) -> None:
    for mtu in mtus:
        rounds = sorted(folder.glob(f"timeline-mtu{mtu}-*"))
        xfer, add = pooled(rounds)
        payload = replay.LINK * tcp_payload_share(mtu)
        print(f"MTU {mtu}: {len(rounds)} rounds, {len(xfer[0])} transfers a step; "
              f"TCP payload at most {tcp_payload_share(mtu):.1%} of the link")
        for s, mib in enumerate(replay.SIZES_MIB):
            q = statistics.quantiles(xfer[s], n=10)
            ideal = mib * 2 ** 20 / payload * 1e3
            print(f"  step {s} {mib:g} MiB: bytes at payload rate {ideal:.2f} ms, transfer median "
                  f"{statistics.median(xfer[s]):.2f}, p10 {q[0]:.2f}, p90 {q[-1]:.2f}, "
                  f"spread {q[-1] - q[0]:.2f} ms")
        drawn = replay.call_ms(random.choice, xfer, add, seed=0)
        median = replay.call_ms(statistics.median, xfer, add)
        print("  " + replay.line("replayed with the measured spread", drawn))
        print("  " + replay.line("replayed with every transfer and addition at its median", median))
        print(f"  the spread costs {drawn - median:.2f} ms a call")


if __name__ == "__main__":
    main(Path(sys.argv[1]), tuple(map(int, sys.argv[2:])) or (1500, 9000))
