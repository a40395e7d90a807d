"""Lightning Fabric (strategy ddp) on ddp_lab's module and data, launched by torchrun like the others.
torchrun --nproc_per_node=2 -m ddp_lab.tools.bench.peers.with_fabric --out r.json model=gpt_small ..."""
import os

import torch

try:
    from lightning_fabric import Fabric
except ImportError:  # the same Fabric, shipped inside the `lightning` package
    from lightning.fabric import Fabric
from torch.utils.data import DataLoader, DistributedSampler

from ddp_lab.tools.bench.peers.peer_parts import StepClock, arguments, batches, build, compose, per_rank_batch


def main() -> None:
    a = arguments("with_fabric")
    cfg = compose(a.overrides)
    fabric = Fabric(accelerator="cuda" if torch.cuda.is_available() else "cpu", strategy="ddp",
                    devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                    precision="bf16-mixed" if cfg.trainer.amp == "bf16" else "32-true")
    fabric.launch()
    model, train, optimizer, loss_fn, _ = build(cfg)
    model, opt = fabric.setup(model, optimizer(model.parameters()))
    sampler = DistributedSampler(train, seed=cfg.seed)
    loader = DataLoader(train, batch_size=per_rank_batch(cfg), sampler=sampler, drop_last=True)
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=False)
    clip, clock = cfg.optim.get("clip_grad_norm", 0.0), StepClock(a.warmup, a.profile_steps, a.out)
    for x, y in batches(loader, sampler, a.steps):
        loss = loss_fn(model(x), y)  # (Fabric's precision plugin autocasts the forward)
        fabric.backward(loss)
        if clip > 0:
            fabric.clip_gradients(model, opt, max_norm=clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.step_done()
    clock.write(a.out, loss)


if __name__ == "__main__":
    main()
