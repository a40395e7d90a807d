# The gradient norm of LeNet at the defaults, step by step (1 process, global batch 512, fp32), from a checkout
# of c8a5524: PYTHONPATH=<checkout> python gradnorm.py SEED STEPS (ran: 5 200). Its output is in gradnorm.txt.
import sys, torch
from hydra import compose, initialize_config_module
from ddp_lab.config import schema
from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer
schema.register()
with initialize_config_module("ddp_lab.conf", version_base="1.3"):
    cfg = compose("train", overrides=["trainer.epochs=2", f"seed={sys.argv[1]}", "trainer.amp=off", "trainer.max_steps=%s" % sys.argv[2], "trainer.keep_ckpts=0"])
tr = Trainer(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), "/tmp/gn/run%s" % sys.argv[1])
norms = []
step = tr.optimizer.step
def wrapped(*a, **k):
    norms.append(torch.nn.utils.clip_grad_norm_(tr.model.parameters(), float("inf")).item())
    return step(*a, **k)
tr.optimizer.step = wrapped
try:
    tr.fit()
except BaseException as e:
    print("stopped", type(e).__name__, e)
import statistics
print("steps", len(norms), "median", statistics.median(norms), "p90", sorted(norms)[int(.9*len(norms))], "max", max(norms))
print([round(n,1) for n in norms[::10]])
