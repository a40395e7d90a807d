"""Sums up timeline.py's traces: per step of halving-doubling (8 ranks, 4 MiB),
the transfer time from the later of the two partners' posts to the receive,
how long a rank waited for its partner to post, and the addition after it.
Iterations straight after a barrier are left out. Usage: timeline_summary.py DIR"""
import json
import statistics as S
import sys

R = [json.load(open(f"{sys.argv[1]}/trace-{r}.json")) for r in range(8)]
nit = len(R[0]); nsteps = len(R[0][0]) - 1
sizes = [2, 1, .5, .5, 1, 2]  # MiB per step at 4 MiB
rows = {k: [[] for _ in range(nsteps)] for k in ("late", "xfer", "add", "gap")}
tot = []
for it in range(nit):
    if it % 4 == 0: continue  # skip the ones after a barrier
    st0 = min(R[r][it][0][2] for r in range(8)); en = max(R[r][it][-1][2] for r in range(8))
    tot.append((en - st0) / 1e6)
    for r in range(8):
        log = R[r][it]
        for s in range(nsteps):
            peer, tag, t0, t1, t2, t3 = log[s]
            p0 = R[peer][it][s][2]
            start = max(t0, p0)
            rows["late"][s].append((p0 - t0) / 1e6 if p0 > t0 else 0)
            rows["xfer"][s].append((t2 - start) / 1e6)
            rows["add"][s].append((t3 - t2) / 1e6)
            if s: rows["gap"][s].append((t0 - log[s-1][5]) / 1e6)
print("iteration (first post .. last end) median %.2f ms, range %.2f-%.2f" % (S.median(tot), min(tot), max(tot)))
link = 125e6 * 0.956
for s in range(nsteps):
    ideal = sizes[s] * 2**20 / link * 1e3
    print(f"step {s} {sizes[s]} MiB ideal {ideal:.2f}  xfer med {S.median(rows['xfer'][s]):.2f} max {max(rows['xfer'][s]):.2f} | waited for partner med {S.median(rows['late'][s]):.2f} max {max(rows['late'][s]):.2f} | add med {S.median(rows['add'][s]):.3f} max {max(rows['add'][s]):.3f}")
# Back to back (not straight after a barrier): the time from one call's last
# end to the next one's, and how far apart the ranks started each call.
period, skew = [], []
for it in range(1, nit):
    if it % 4 == 0: continue
    period.append((max(R[r][it][-1][2] for r in range(8)) - max(R[r][it - 1][-1][2] for r in range(8))) / 1e6)
    starts = [R[r][it][0][2] for r in range(8)]
    skew.append((max(starts) - min(starts)) / 1e6)
busbw = 2 * 7 / 8 * 4 * 2**20 / (S.median(period) / 1e3)
print("back to back: one call every %.2f ms (median; %.2f-%.2f), busbw %.1f%% of 1 Gbit/s; the ranks started "
      "each call %.2f ms apart (median; max %.2f)" % (S.median(period), min(period), max(period), busbw / 125e6 * 100,
                                                      S.median(skew), max(skew)))
