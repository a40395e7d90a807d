"""On a GPU no step that is not a log step waits for the device: torch's sync debug mode
raises on any host sync (an .item(), a blocking copy back, a nonzero) inside those steps."""
import pytest
import torch

from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer
from tests.conftest import tiny_overrides

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("measure", ["full", "light", "off"])
@pytest.mark.parametrize("extra", [[], ["trainer.grad_accum=2"], ["trainer.amp=fp16"]])
def test_a_step_that_is_not_a_log_step_never_syncs_the_host(compose_train, tiny_fmnist, tmp_path,
                                                             monkeypatch, measure, extra):
    args = [o for o in tiny_overrides(tiny_fmnist, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.log_every=5", "trainer.max_steps=12", "trainer.warmup_steps=2",
                                "trainer.compile=off", f"trainer.measure={measure}", *extra])
    guarded = []
    run_batch, after_step = Trainer._run_batch, Trainer._after_step

    def quiet(method):
        def run(self, *a):
            step = self.step + (1 if method is run_batch else 0)  # the step being taken or just taken
            if step <= 2 or step % 5 == 0 or step == 12:  # allocating; reading the loss; saving the end
                return method(self, *a)
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = method(self, *a)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            guarded.append(step)
            return out
        return run

    monkeypatch.setattr(Trainer, "_run_batch", quiet(run_batch))
    monkeypatch.setattr(Trainer, "_after_step", quiet(after_step))
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cuda", 0), "none"), tmp_path)
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert sorted(set(guarded)) == [3, 4, 6, 7, 8, 9, 11]
