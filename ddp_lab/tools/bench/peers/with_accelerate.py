"""Hugging Face Accelerate on ddp_lab's module and data, launched by torchrun like the others.
torchrun --nproc_per_node=2 -m ddp_lab.tools.bench.peers.with_accelerate --out r.json model=gpt_small ..."""
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, DistributedSampler

from ddp_lab.tools.bench.peers.peer_parts import StepClock, arguments, batches, build, compose, per_rank_batch


def main() -> None:
    a = arguments("with_accelerate")
    cfg = compose(a.overrides)
    acc = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="bf16" if cfg.trainer.amp == "bf16" else "no")
    model, train, optimizer, loss_fn, _ = build(cfg)
    model, opt = acc.prepare(model, optimizer(model.parameters()))
    sampler = DistributedSampler(train, seed=cfg.seed)  # (the loader as the others have it, not prepared)
    loader = DataLoader(train, batch_size=per_rank_batch(cfg), sampler=sampler, drop_last=True,
                        pin_memory=acc.device.type == "cuda")
    clip, clock = cfg.optim.get("clip_grad_norm", 0.0), StepClock(a.warmup, a.profile_steps, a.out)
    for x, y in batches(loader, sampler, a.steps):
        x, y = x.to(acc.device, non_blocking=True), y.to(acc.device, non_blocking=True)
        with acc.autocast():
            loss = loss_fn(model(x), y)
        acc.backward(loss)
        if clip > 0:
            acc.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.step_done()
    clock.write(a.out, loss)


if __name__ == "__main__":
    main()
