"""What a run reports: TensorBoard scalars, the console, and the atomic JSON writer.

(What it measures is in ddp_lab.telemetry.meter. A training run's summary.json is
written by ddp_lab/training/results.py with write_json_atomic; RunLogger.summary
writes the d2l baselines'.)

Only rank 0 writes TensorBoard events and summary.json; every other rank gets
the same object with writing switched off, so callers need no `if rank == 0`.
"""
from __future__ import annotations

import json
import math
import os
import resource
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory in MiB: CUDA memory allocated on a GPU, else peak RSS.

    Peak RSS (getrusage, KiB on Linux) covers this process only: DataLoader
    workers and other ranks are processes of their own.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_now_mb(device: torch.device) -> float:
    """This process's memory now in MiB: CUDA memory allocated on a GPU, else its RSS (peak_memory_mb's now)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _flat_hparams(cfg, world_size: int, backend: str) -> dict:
    """The knobs that tell runs of a sweep apart, as TensorBoard HParams wants them (`cfg`: a config, or one
    as plain values)."""
    c = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    out = {"world_size": world_size, "backend": backend, "seed": c["seed"]}
    for group in ("model", "data", "optim", "sync", "trainer"):
        for k, v in c.get(group, {}).items():
            if isinstance(v, (int, float, str, bool)) and not k.startswith("_"):
                out[f"{group}.{k}"] = v
    return out


class RunLogger:
    """TensorBoard on rank 0, plus the console lines and summary.json."""

    def __init__(self, run_dir: Path, is_main: bool, purge_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.is_main = is_main
        # A resumed run continues the same event files' story: events an earlier
        # attempt logged from this step on are hidden (not deleted) in TensorBoard.
        self.purge_step = purge_step
        self._writer: SummaryWriter | None = None
        self._closed = False

    @property
    def writer(self) -> SummaryWriter | None:
        """Rank 0's event file (None elsewhere and once closed), opened at the first
        write: a run refused at start (a bad input) leaves no empty event file."""
        if self.is_main and not self._closed and self._writer is None:
            self._writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=self.purge_step)
        return self._writer

    def scalars(self, values: dict[str, float], step: int) -> None:
        if (w := self.writer) is not None:
            for tag, v in values.items():
                w.add_scalar(tag, v, step)

    def config(self, cfg) -> None:
        if (w := self.writer) is not None:
            text = OmegaConf.to_yaml(cfg, resolve=True)
            # Four-space indent: TensorBoard renders text as Markdown, this keeps it a code block.
            w.add_text("config", "    " + text.replace("\n", "\n    "))

    def hparams(self, cfg, world_size: int, backend: str, final: dict[str, float]) -> None:
        """Written into the run's own event file, so a sweep's runs line up in the HParams tab."""
        if (w := self.writer) is None:
            return
        metrics = {f"hparam/{k}": v for k, v in final.items()}
        exp, ssi, sei = hparams(_flat_hparams(cfg, world_size, backend), metrics)
        fw = w._get_file_writer()
        for s in (exp, ssi, sei):
            fw.add_summary(s)
        for tag, v in metrics.items():
            w.add_scalar(tag, v, 0)

    def print(self, line: str) -> None:
        if self.is_main:
            print(line, flush=True)

    def summary(self, data: dict) -> None:
        if self.is_main:
            write_json_atomic(self.run_dir / "summary.json", data)

    def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _json_safe(v):
    """NaN or infinity (a figure with no measured step behind it) is not JSON: null,
    at any depth (the straggler's slowdown is nested)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def write_json_atomic(path: Path, data: dict) -> None:
    """Write to a temp file, then rename: readers see the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    clean = _json_safe(data)
    try:
        tmp.write_text(json.dumps(clean, indent=2, sort_keys=True, allow_nan=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when the write failed (a full disk, say)


def _rate(v: float | None) -> str:
    # n/a: every step of it was warm-up (NaN), or none ran in this launch (null)
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.0f}"


def epoch_line(epoch: int, epochs: int, m: dict, task=None, steps: tuple[int, int] | None = None) -> str:
    """An evaluated epoch's console line; `steps` (step, total) where trainer.max_steps cut the
    run inside its epochs: then the line counts steps and gives a step's time, not the epoch's."""
    name = task.name if task is not None else "classification"
    if name == "language_model":
        held = (f"val loss {m['loss/val']:.4f}  ppl {m['ppl/val']:.2f}  token acc {m['token_acc/val']:.3f}  "
                f"{_rate(m.get('perf/tokens_per_sec'))} tok/s")
    elif name == "regression":
        held = (f"test loss {m['loss/test']:.4f}  {_rate(m['perf/samples_per_sec'])} samples/s "
                f"({_rate(m['perf/samples_per_sec_per_rank'])}/rank)")
    else:
        held = (f"train acc {m['acc/train']:.3f}  test acc {m['acc/test']:.3f}  "
                f"{_rate(m['perf/samples_per_sec'])} img/s ({_rate(m['perf/samples_per_sec_per_rank'])}/rank)")
    if steps is not None:
        return f"step {steps[0]}/{steps[1]}  loss {m['loss/train']:.4f}  {held}  {_ms(m.get('perf/step_ms'))} ms/step"
    return f"epoch {epoch + 1}/{epochs}  loss {m['loss/train']:.4f}  {held}  {m['perf/epoch_s']:.1f} s"


def _ms(v: float | None) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.1f}"


def final_line(s: dict, headline: str = "test_acc") -> str:
    """d2l's closing line, e.g. `test acc 0.85, 4.1 sec/epoch, 14,200 img/s on 2 x cpu (gloo)`;
    a language model's: `val loss 1.52 (ppl 4.57), 20.1 sec/epoch, 41,000 tok/s on ...`; a
    regression's: `test loss 0.0102, ...`. A run that trainer.max_steps cut inside its epochs
    (summary.json's max_steps_cut) says its steps and a step's time instead of sec/epoch:
    `test acc 0.61, 50 steps (trainer.max_steps), 48.2 ms/step, ...`."""
    if headline == "val_loss":
        first = f"val loss {s['val_loss']:.2f} (ppl {s['val_ppl']:.2f})"
        rate = f"{_rate(s.get('tokens_per_sec'))} tok/s"
    elif headline == "test_loss":
        first, rate = f"test loss {s['test_loss']:.4g}", f"{_rate(s['samples_per_sec'])} samples/s"
    else:
        first, rate = f"test acc {s['test_acc']:.2f}", f"{_rate(s['samples_per_sec'])} img/s"
    pace = (f"{s['steps']} steps (trainer.max_steps), {_ms(s.get('step_ms'))} ms/step" if s.get("max_steps_cut")
            else f"{s['sec_per_epoch']:.1f} sec/epoch")
    line = f"{first}, {pace}, {rate} on {s['world_size']} x {s['device']} ({s['backend']})"
    if "mfu" not in s:  # a summary without MFU at all (the d2l baselines')
        return line
    mfu = s["mfu"]  # n/a: no step measured, or no peak to measure it against
    return line + f", MFU {'n/a' if mfu is None or not math.isfinite(mfu) else f'{100 * mfu:.1f}%'}"
