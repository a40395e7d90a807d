"""sync=ft_ddp: DDP across torchft islands, every step (torchft's fault-tolerant DDP).

Inside each island the inner strategy averages the gradients over the island's K ranks: whole (sync/inner=ddp
or flat, as DDP does) or each rank its shard of them (sync/inner=zero or fsdp: fault-tolerant HSDP); then the
gradients of what each rank's optimizer steps are averaged over the islands present through torchft's
Manager (islands/replica_group.py: rank j of every island, the mean of those that are there), and the
optimizer steps only where every island present voted for the step (`agreed`, torchft's should_commit). A
step whose exchange failed (an island died in it) is taken nowhere: its gradients are dropped, the weights
stay as they were (the same on every island), and the next step's quorum leaves the lost island out; the
learning-rate schedule goes on. A quorum every step (the Trainer's `counted`), where a restarted island is
healed from a peer before its first step. With every island present this is DDP over all the ranks
(tests/sync/test_replica_group.py compares them). Floating buffers (BatchNorm's statistics) ride along in the
same exchange: each rank's averaged with the same rank's of the other islands (inside an island the inner
strategy hands rank 0's to the others at the next forward, as DDP does), kept where the step was agreed.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.distributed import DistEnv
from ddp_lab.sync.base import NO_CONTEXT, ReplicaSync, SyncContext
from ddp_lab.sync.periodic.periodic_options import FTDDPOptions
from ddp_lab.telemetry import position


class FTDDPSync(ReplicaSync):
    averages = "gradients"  # (of what the optimizer steps: the island strategy hands them over as ctx.trained)

    def __init__(self, model: nn.Module, env: DistEnv, cfg: FTDDPOptions, ctx: SyncContext = NO_CONTEXT):
        super().__init__(model, env)
        if ctx.islands is None or ctx.islands.replicas is None:
            raise ConfigError("sync=ft_ddp runs across torchft islands: set sync.islands=host and "
                              "sync.fault_tolerance=torchft")
        self.cfg, self.replicas = cfg, ctx.islands.replicas
        mine = [p for p in model.parameters() if p.requires_grad]
        self.stepped = ctx.trained or (lambda: mine)  # what the optimizer steps (sharded inside: this rank's shards)
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]  # (BatchNorm's statistics)
        self.step, self.ok = 0, True  # (ok: this step's exchange was agreed by every island present)

    @torch.no_grad()
    def after_backward(self) -> None:
        """The island's mean gradients (the inner strategy's) <- their mean over the islands present; the vote."""
        grads = [p.grad for p in self.stepped() if p.grad is not None]
        # fsdp's DTensors: this rank's rows (sharded/fsdp.py's local(), written out: importing it here would
        # register zero and fsdp before the periodic strategies, and reorder every list of strategies)
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        flat = torch.cat([t.reshape(-1).float() for t in grads + self.buffers])
        with position.collective("gradient sync across islands", own_timeout_s=self.replicas.exchange_s), self._timed():
            self.replicas.mean(flat).wait()
        self.count(flat.numel() * flat.element_size(), across=True)
        self.ok = self.replicas.commit(self.step + 1, "step")
        offset = 0
        for t in grads + (self.buffers if self.ok else []):  # (not agreed: each island keeps its own statistics)
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def agreed(self) -> bool:
        return self.ok

    def after_step(self, step: int) -> None:
        self.step = step

    def synced_at(self, step: int) -> bool:
        return True  # (every island holds the same weights after every step; a quorum every step)

    @contextlib.contextmanager
    def consensus(self):
        yield

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        self.step = shared.get("step", self.step)

    def describe(self) -> str:
        return "ft_ddp(gradients every step across torchft islands)"
