"""The Trainer's own step, in one process: what a step reports."""
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer
from tests.conftest import tiny_overrides


def test_a_step_of_several_micro_batches_reports_their_mean_loss(compose_train, tiny_fmnist, tmp_path):
    """loss/train_step under trainer.grad_accum=2 is the step's loss (the mean of its
    micro-batches' losses before the update), not the last micro-batch's."""
    args = [o for o in tiny_overrides(tiny_fmnist, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.grad_accum=2", "trainer.amp=off", "trainer.threads=1"])
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path)
    try:
        micro = list(trainer.train_loader.epoch(0))[:2]
        with torch.no_grad():
            losses = [trainer.task.loss(trainer.model(x), y).item() for x, y in micro]
        trainer._run_batch(micro)
        assert abs(losses[0] - losses[1]) > 1e-3  # two batches that tell the cases apart
        assert abs(trainer.last_loss.item() - sum(losses) / 2) < 1e-5
    finally:
        trainer.close()


def test_optim_clip_grad_norm_bounds_the_step(compose_train, tiny_fmnist, tmp_path):
    """optim.clip_grad_norm: plain SGD's first step moves the weights by exactly lr x the clipped norm."""
    args = [o for o in tiny_overrides(tiny_fmnist, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.amp=off", "trainer.threads=1", "optim.lr=0.1", "optim.momentum=0",
                                "optim.nesterov=false", "optim.weight_decay=0", "optim.schedule=constant",
                                "optim.warmup_epochs=0", "optim.clip_grad_norm=0.001"])
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), tmp_path)
    try:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer._run_batch(list(trainer.train_loader.epoch(0))[:1])
        moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(trainer.model.parameters(), before)])
        assert abs(moved.norm().item() - 0.1 * 0.001) < 1e-7
    finally:
        trainer.close()
