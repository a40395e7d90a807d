"""What the checkpoint tests share: a tiny model, optimizer and schedule, saved."""
import torch
from torch import nn

from ddp_lab import checkpoint
from ddp_lab.distributed import DistEnv

CPU = torch.device("cpu")
ALONE = DistEnv(0, 1, 0, CPU, "none")


def parts(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def train_steps(model, opt, sched, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(5, 4)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def save_small(root, step, keep=5, subset=None, env=ALONE):
    model, opt, sched = parts()
    train_steps(model, opt, sched, 2)
    shared = {"model": model.state_dict(), "optimizer": opt.state_dict(),
              "scheduler": sched.state_dict(), "step": step}
    subset = subset or {"optim": {"lr": 0.1}, "seed": 0}
    meta = {"config_hash": checkpoint.config_hash(subset), "config": subset}
    own = {"rng": checkpoint.rng_state(CPU), "sums": torch.tensor([1.5, 2.0, 3.0], dtype=torch.float64)}
    return checkpoint.save(root, step, env, own, shared, meta, keep), shared, own
