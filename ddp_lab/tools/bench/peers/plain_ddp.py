"""The plain loop: pytorch/examples' DDP tutorial (distributed/ddp-tutorial-series) with autocast
and clipping, on ddp_lab's module and data. torchrun --nproc_per_node=2 -m
ddp_lab.tools.bench.peers.plain_ddp --out r.json model=gpt_small data=text optim=adamw"""
import gc

import torch
import torch._dynamo  # noqa: F401  (before the group: imported after it, as DDP does, it keeps the group alive)
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddp_lab.tools.bench.peers import peer_parts as peer


def main() -> None:
    a = peer.arguments("plain_ddp")
    cfg = peer.compose(a.overrides)
    dev = peer.device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    model, train, optimizer, loss_fn, bf16 = peer.build(cfg)
    model = DDP(model.to(dev), device_ids=[dev] if dev.type == "cuda" else None)
    opt = optimizer(model.parameters())
    sampler = DistributedSampler(train, seed=cfg.seed)
    loader = DataLoader(train, batch_size=peer.per_rank_batch(cfg), sampler=sampler, drop_last=True,
                        pin_memory=dev.type == "cuda")
    clip, clock = cfg.optim.get("clip_grad_norm", 0.0), peer.StepClock(a.warmup, a.profile_steps, a.out)
    for x, y in peer.batches(loader, sampler, a.steps):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.step_done()
    clock.write(a.out, loss)


if __name__ == "__main__":
    main()
    gc.collect()  # what holds DDP in a reference cycle holds the group: gone first, else gloo's threads outlive it
    dist.destroy_process_group()
