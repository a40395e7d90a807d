"""What a stage-3 or fsdp rank holds beyond its state, phase by phase: a 101M-parameter GPT (8 blocks of
1024, bytes vocabulary, 128 tokens, batch 1) at 2 ranks, AdamW, 3 steps; RSS now and the peak so far
after the build and after each forward, backward and optimizer step. From the repository root:
    python docs/results/2026-11-29_zen4-2c_memory-wall-8-hosts/transient.py builtin direct fsdp
(the numbers behind memory_estimate.TRANSIENT_UNITS)."""
import resource
import sys

import torch

from tests.multiproc import run_in_processes
from tests.sync import sync_cfg


def rss() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phases(rank, world_size, algo):
    from ddp_lab.distributed import DistEnv
    from ddp_lab.models.gpt import gpt
    from ddp_lab.models.meta_init import MetaInit, build_on_meta
    from ddp_lab.sync import build_sync
    from ddp_lab.sync.sharded.common import return_freed_blocks

    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    return_freed_blocks(env.device)
    out = [("start", rss(), peak())]
    torch.manual_seed(0)
    model, _ = build_on_meta(lambda: gpt(vocab_size=256, block_size=128, n_layer=8, n_head=16, n_embd=1024))
    init = MetaInit(model)
    cfg = sync_cfg("fsdp") if algo == "fsdp" else sync_cfg("zero", zero_stage=3, algo=algo)
    sync = build_sync(cfg, model, env, init)
    out.append(("built", rss(), peak()))
    opt = torch.optim.AdamW(sync.parameters(), lr=1e-4, foreach=False)
    x = torch.randint(0, 256, (1, 128))
    for step in range(3):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        out.append((f"forward {step}", rss(), peak()))
        loss.backward()
        out.append((f"backward {step}", rss(), peak()))
        opt.step()
        opt.zero_grad(set_to_none=False)
        out.append((f"step {step}", rss(), peak()))
    return sum(p.numel() for p in model.parameters()), out


if __name__ == "__main__":
    for algo in sys.argv[1:]:
        n, out = run_in_processes(phases, 2, algo, timeout=600)[0]
        print(f"{algo}: {n:,} parameters, a rank's shard {n * 4 / 2 / 2**20:.0f} MiB, largest unit (a block) "
              f"{12_596_224 * 4 / 2**20:.0f} MiB; MiB:")
        for name, now, top in out:
            print(f"  {name:12s} rss {now:7.0f}  peak so far {top:7.0f}")
