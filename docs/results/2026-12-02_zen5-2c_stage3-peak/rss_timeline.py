"""ddp_lab.train with an RSS timeline (every 1 ms) and zero3's unit events, for rank 0: run it in place of
`-m ddp_lab.train` (torchrun ... rss_timeline.py OVERRIDES), PROBE_DIR=<folder> for series.txt and events.txt."""
import atexit, os, runpy, sys, threading, time
from ddp_lab.telemetry import position
T0 = time.monotonic(); series = []; events = []
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
def sample():
    while True:
        series.append((time.monotonic() - T0, position.HERE.step, rss())); time.sleep(0.001)
threading.Thread(target=sample, daemon=True).start()
def ev(name):
    events.append((time.monotonic() - T0, position.HERE.step, name, rss()))
from ddp_lab.sync.sharded import zero3, zero1
Z = zero3.Zero3Sync
for meth in ("_gather", "_send", "_free", "_end_backward"):
    orig = getattr(Z, meth)
    def wrap(self, *a, orig=orig, meth=meth):
        tag = meth
        if meth in ("_gather", "_free") and a and isinstance(a[0], list) and a[0]:
            tag += f" u{[id(u) for p in self.parts for u in p].index(id(a[0][0]))}"
        elif meth == "_send":
            tag += f" {a[0]}"
        ev(tag + " <"); r = orig(self, *a); ev(tag + " >"); return r
    setattr(Z, meth, wrap)
orig_land = zero1.Zero1Sync._land
def land(self, *a):
    ev(f"_land {a[1]} <"); r = orig_land(self, *a); ev(f"_land {a[1]} >"); return r
zero1.Zero1Sync._land = land
def dump():
    if os.environ.get("RANK", "0") != "0":
        return
    d = os.environ.get("PROBE_DIR", "/tmp/probe")
    with open(f"{d}/series.txt", "w") as f:
        for t, s, r in series: f.write(f"{t:.4f}\t{s}\t{r:.1f}\n")
    with open(f"{d}/events.txt", "w") as f:
        for t, s, n, r in events: f.write(f"{t:.4f}\t{s}\t{n}\t{r:.1f}\n")
atexit.register(dump)
sys.argv = ["ddp_lab.train", *sys.argv[1:]]
runpy.run_module("ddp_lab.train", run_name="__main__", alter_sys=True)
