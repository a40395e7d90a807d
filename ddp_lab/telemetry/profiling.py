"""A timeline of a few training steps on every rank (trainer.profile=true).

torch.profiler records `profile_active` steps after skipping `profile_wait`
steps (and one more as its own warm-up), then writes one Chrome trace per
rank to `<run dir>/profile/rank<N>.json`, and beside it `rank<N>.txt`: the
ops that took the most time of those steps, by self time (time in the op
itself, not in the ops it called), as torch.profiler's own table. Open it in https://ui.perfetto.dev
(or chrome://tracing): the forward and backward ops sit on the main thread;
DDP's bucket allreduces (gloo/NCCL `allreduce` ops, or the sends and
receives of the hand-written algorithms) show where communication overlaps
the backward pass and where the step waits for it.
"""
from __future__ import annotations

from pathlib import Path

from torch.profiler import ProfilerActivity, profile, schedule

TOP_OPS = 25  # rows of the table beside each trace


class StepProfiler:
    """Call step() once per optimizer step; close() at the end. A no-op when disabled."""

    def __init__(self, enabled: bool, wait: int, active: int, run_dir: Path, rank: int,
                 cuda: bool):
        self.prof = None
        if not enabled:
            return
        self.path, self.active = Path(run_dir) / "profile" / f"rank{rank}.json", active
        self.path.parent.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(activities=activities,
                            schedule=schedule(wait=wait, warmup=1, active=active, repeat=1),
                            on_trace_ready=self._save, record_shapes=False, with_stack=False)
        self.prof.start()

    def _save(self, prof) -> None:
        prof.export_chrome_trace(str(self.path))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)
        self.path.with_suffix(".txt").write_text(
            f"The {TOP_OPS} ops with the most self CPU time over the {self.active} profiled step(s) "
            f"of this rank ({self.path.stem}); ProfilerStep#N rows are whole steps.\n{table}")

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def close(self) -> None:
        if self.prof is not None:
            self.prof.stop()
            self.prof = None

