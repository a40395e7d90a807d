"""The link's constants from gapped.py's medians, as training uses the link (one all-reduce of a
strategy's size after an idle gap): time = 2(N-1) alpha + 2(N-1)/N bytes beta for gloo's ring
(gamma 0: the reduction's time is inside beta here), fitted by least squares over the sizes, written
as a cost model fit.csv for bench.time_to_accuracy --fit.
    python fit_link.py <gapped.py output> <world size> <fit.csv>"""
import re
import sys

lines, world, out = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
points = [(int(b), float(ms) / 1e3) for b, ms in re.findall(r"bytes (\d+) gap_s \S+ median_ms (\S+)", lines)]
n = len(points)
mx, my = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
intercept = max(my - slope * mx, 0.0)
alpha, beta = intercept / (2 * (world - 1)), slope / (2 * (world - 1) / world)
errors = [abs((intercept + slope * b) / t - 1) for b, t in points]
with open(out, "w") as f:
    f.write("algo,points,alpha_s,beta_s_per_byte,gamma_s_per_byte,median_abs_rel_err,max_abs_rel_err\n")
    f.write(f"builtin,{n},{alpha:.6g},{beta:.6g},0.0,{sorted(errors)[n // 2]:.4f},{max(errors):.4f}\n")
print(open(out).read(), end="")
