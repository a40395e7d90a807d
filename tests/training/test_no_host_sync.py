"""No step that is not a log step waits for the device. On a GPU torch's sync debug mode raises on
any host sync (an .item(), a blocking copy back, a nonzero) inside those steps. On a CPU nothing
waits, so the same steps are watched for the reads that would wait on a GPU: every value a step
hands back to Python (.item(), float(), bool(), a nonzero, torch.equal). What a CPU cannot show:
a .tolist(), .cpu() or .numpy() (no op is dispatched for them there), and the loss check's reads,
every step on CPU by design (guards/divergence.py: on CUDA only at log steps)."""
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddp_lab.distributed import DistEnv
from ddp_lab.training.callbacks import Callbacks
from ddp_lab.training.trainer import Trainer
from tests.conftest import tiny_overrides

READS_BACK = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}
CPU_BY_DESIGN = "ddp_lab/guards/divergence.py"  # the loss check: every step on CPU, at log steps on CUDA


class HostReads(TorchDispatchMode):
    """Notes where each value is read back to the host (the innermost ddp_lab frame)."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READS_BACK:
            import traceback
            ours = [f for f in traceback.extract_stack() if "/ddp_lab/" in f.filename and "/tests/" not in f.filename]
            where = f"ddp_lab/{ours[-1].filename.split('/ddp_lab/', 1)[1]}:{ours[-1].lineno}" if ours else "torch"
            if not where.startswith(CPU_BY_DESIGN):
                self.reads.append(f"{func} at {where}")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def cuda_sync_errors():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def guarded_steps(monkeypatch, guard) -> list[int]:
    """Run every step but the first two (allocating), the log steps (every 5th) and the last (saving the
    end) from its first callback to its last under `guard()`; returns those steps."""
    guarded, open_guard = [], []
    step_start, step_end = Callbacks.step_start, Callbacks.step_end

    def start(self, tr, micro):
        step = tr.step + 1
        if not (step <= 2 or step % 5 == 0 or step == 12):
            open_guard.append(guard())
            open_guard[-1].__enter__()
            guarded.append(step)
        step_start(self, tr, micro)

    def end(self, tr):
        try:
            step_end(self, tr)
        finally:
            if open_guard:
                open_guard.pop().__exit__(None, None, None)

    monkeypatch.setattr(Callbacks, "step_start", start)
    monkeypatch.setattr(Callbacks, "step_end", end)
    return guarded


def fit_watched(compose_train, tiny_fmnist, tmp_path, monkeypatch, device, guard, extra) -> list[int]:
    args = [o for o in tiny_overrides(tiny_fmnist, tmp_path) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.epochs=10", "trainer.log_every=5", "trainer.max_steps=12",
                                "trainer.warmup_steps=2", "trainer.compile=false", "trainer.threads=1", *extra])
    guarded = guarded_steps(monkeypatch, guard)
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, device, "none"), tmp_path)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return guarded


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("measure", ["full", "light", "off"])
@pytest.mark.parametrize("extra", [[], ["trainer.grad_accum=2"], ["trainer.amp=fp16"]])
def test_on_a_gpu_a_step_that_is_not_a_log_step_never_syncs_the_host(compose_train, tiny_fmnist, tmp_path,
                                                                     monkeypatch, measure, extra):
    guarded = fit_watched(compose_train, tiny_fmnist, tmp_path, monkeypatch, torch.device("cuda", 0),
                          cuda_sync_errors, [f"trainer.measure={measure}", *extra])
    assert guarded == [3, 4, 6, 7, 8, 9, 11]


@pytest.mark.parametrize("extra", [["trainer.measure=full"], ["trainer.measure=off", "trainer.grad_accum=2"],
                                   ["trainer.measure=light", "trainer.amp=bf16"]])
def test_on_a_cpu_a_step_that_is_not_a_log_step_reads_nothing_back(compose_train, tiny_fmnist, tmp_path,
                                                                   monkeypatch, extra):
    watch = HostReads()
    guarded = fit_watched(compose_train, tiny_fmnist, tmp_path, monkeypatch, torch.device("cpu"),
                          lambda: watch, ["trainer.amp=off", *extra])
    assert guarded == [3, 4, 6, 7, 8, 9, 11]
    assert watch.reads == []


def test_the_watch_sees_a_read_back(compose_train, tiny_fmnist, tmp_path, monkeypatch):
    """The CPU test's watch is not blind: a loss read after every step is caught at each watched step."""
    from ddp_lab.training.callbacks import Measure

    measured = Measure.step_end
    monkeypatch.setattr(Measure, "step_end", lambda self, tr: (measured(self, tr), float(tr.last_loss)))
    watch = HostReads()
    guarded = fit_watched(compose_train, tiny_fmnist, tmp_path, monkeypatch, torch.device("cpu"),
                          lambda: watch, ["trainer.amp=off"])
    assert len(guarded) == 7 and len(watch.reads) == 7, watch.reads
    assert all(r.startswith("aten._local_scalar_dense.default at ddp_lab/training/callbacks.py:") for r in watch.reads)
