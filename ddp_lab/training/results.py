"""A finished run's results on disk: model.pt, model.safetensors and summary.json (rank 0); for a
transformers model also hf/, a directory its from_pretrained loads (config.json, model.safetensors).

Both are written under a temporary name and renamed into place, so a kill
or a full disk never leaves half a file, nor replaces a good one; weights
that are not finite are never written (ddp_lab.guards.divergence should have
stopped the run first). summary.json comes last: its presence means the
run completed.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch

from ddp_lab.checkpoint.files import write_error
from ddp_lab.config import RunFailed
from ddp_lab.telemetry.memory import by_rank, model_state_bytes
from ddp_lab.telemetry.metrics import peak_memory_mb, write_json_atomic
from ddp_lab.training.model_file import ModelFile
from ddp_lab.training.safetensors_file import SafetensorsFile, SafetensorsShards, layout_bytes
from ddp_lab.training.tasks import summary_name

FIGURES = ("loss", "acc", "ppl", "token_acc")  # a task's figures (ddp_lab.training.tasks), by TensorBoard name


def run_summary(parts) -> dict:
    """What summary.json holds: results, speed over the post-warm-up window (null where
    not measured), and the settings that tell runs apart. A collective (stragglers).
    Asks the parts (training/builder.py), not the Trainer.

    The figures of the run so far (accuracy, loss, sec/epoch) come from the checkpoint
    of a resumed launch; the speed figures are this launch's own, null where it ran no
    step (one resumed at its last step).
    """
    info, env, progress, task = parts.info, parts.env, parts.progress, parts.work.task
    last, tp, sync = progress.last, parts.meter.throughput, parts.sync
    rate = tp.per_sec
    comm_ms, comm_frac = sync.comm_figures(tp.steps, tp.seconds)
    seconds = parts.meter.epoch_seconds
    peaks = by_rank(peak_memory_mb(env.device), env)  # every rank's: under zero the ranks are not alike
    return {
        # the task's figures, named by it: test_acc, train_loss (classification); val_ppl, ...
        **{summary_name(k): v for k, v in last.items() if k.split("/")[0] in FIGURES},
        # (a task whose figure is the loss alone counts no correct predictions)
        **{k: v for k, v in last.items() if k.endswith("_total") or (k.endswith("_correct") and
                                                                      task.correct_name)},
        "task": task.name, "samples_per_sec": rate,
        "samples_per_sec_per_rank": rate / env.world_size,
        "sec_per_epoch": sum(seconds) / len(seconds), "step_ms": tp.step_ms,
        "data_ms": 1000 * parts.meter.data_seconds / tp.seen if tp.seen else math.nan,
        "epochs": progress.epoch, "steps": progress.step, "world_size": env.world_size,
        # trainer.max_steps ended the run before its epochs did (the closing line counts steps)
        "max_steps_cut": parts.plan.cut,
        "world_sizes": progress.world_sizes,
        # how often torchrun started each rank's process again (--max-restarts)
        "restarts_by_rank": [int(x) for x in by_rank(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), env)],
        **sync.summary_fields(),  # (torchft islands: the island, its membership over time, rounds dropped)
        "backend": env.backend if env.distributed else "none",
        "comm_threads": env.comm_threads, "device": env.device.type,
        "model": info.model, "data": info.data,
        "sync": sync.describe(),
        "global_batch": info.global_batch, "amp": parts.amp, "seed": info.seed,
        "threads": torch.get_num_threads(), "compile": parts.compiled,
        "measured_steps": tp.steps, "comm_timing": sync.comm_timing,
        "comm_ms_per_step": comm_ms, "comm_frac": comm_frac,
        # bytes handed to all-reduces per optimizer step, as counted at each call (ddp_lab.sync)
        "wire_bytes_per_step": sync.wire_bytes / tp.seen if tp.seen else None,
        "collectives_per_step": sync.collectives / tp.seen if tp.seen else None,  # the calls carrying them
        # sync.islands: those of them that crossed between islands (the slow link)
        "wire_bytes_across_per_step": sync.wire_bytes_across / tp.seen if tp.seen else None,
        **parts.target.summary(),  # target, target_reached, steps_to_target, time_to_target_s, eval_s
        "peak_mem_mb": peaks[0], "peak_mem_mb_by_rank": peaks,  # rank 0's, every rank's (telemetry/memory.py)
        # every rank's memory before the model's build, and its peak once the model is built and sharded (the
        # process's high-water mark then: a whole build's copy, or zero 3's and fsdp's one unit at a time)
        "before_build_mb_by_rank": [round(x, 1) for x in by_rank(parts.built_mb[0], env)],
        "build_peak_mb_by_rank": [round(x, 1) for x in by_rank(parts.built_mb[1], env)],
        # what the memory estimate predicted before the first step (training/memory_estimate.py; CPU runs)
        "predicted_peak_mb_by_rank": None if parts.memory is None else
        [round(b / 2**20, 1) for b in by_rank(parts.memory.peak_bytes, env)],
        # its DataLoader workers' private memory together, the largest sampled (telemetry/worker_memory.py), and
        # what the estimate priced them at (data.loader=dataloader with data.num_workers; else 0)
        "loader_workers_mb_by_rank": [round(b / 2**20, 1) for b in by_rank(parts.workers.peak_bytes, env)],
        "predicted_workers_mb_by_rank": None if parts.memory is None else
        [round(b / 2**20, 1) for b in by_rank(parts.memory.worker_bytes, env)],
        # counted at the second step's sync (telemetry/step_measure.py), or now if it took fewer
        "model_state_bytes": [int(b) for b in by_rank(counted_state(parts), env)],
        "straggler": parts.measure.straggler(info.straggler_threshold),
        "mfu": parts.meter.mfu(rate), "peak_flops": parts.meter.peak_flops,
        "flops_per_sample": parts.meter.flops_per_image,
        **({"tokens_per_sec": rate * parts.work.targets_per_sample}
           if task.name == "language_model" else {}),
    }


def memory_scalars(summary: dict) -> dict[str, float]:
    """TensorBoard's memory figures of the run, one per rank (MiB)."""
    model = {f"mem/model_state_mb/rank{r}": b / 2**20 for r, b in enumerate(summary["model_state_bytes"])}
    return {**model, **{f"mem/peak_mb/rank{r}": mb for r, mb in enumerate(summary["peak_mem_mb_by_rank"])}}


def write_results(run_dir: Path, layout: dict, weights, summary: dict, main: bool, hf_config=None,
                  hf_max_shard_mb: int = 50_000) -> None:
    """model.pt and model.safetensors (laid out as `layout`, the sync's state_layout(); written a tensor at a
    time as `weights`, its each_weight(), hands them out: training/model_file.py, safetensors_file.py), hf/
    where `hf_config` (a transformers model's configuration) is given (its weights model.safetensors, or above
    `hf_max_shard_mb` MB files of at most that and their index, as save_pretrained writes them), and
    summary.json, by rank 0; every rank runs `weights` to its end."""
    if not main:
        for _ in weights:  # (a sharded model: every rank takes part in each gather)
            pass
        return
    run_dir = Path(run_dir)
    tmp, tmp_st, tmp_hf = run_dir / ".model.pt.tmp", run_dir / ".model.safetensors.tmp", run_dir / ".hf.tmp"
    bad, size = [], 0
    sharded = hf_config is not None and layout_bytes(layout) > hf_max_shard_mb * 10**6
    try:
        outs = [ModelFile(tmp, layout), SafetensorsFile(tmp_st, layout)]
        if sharded:  # (hf/'s own files, written beside model.safetensors a tensor at a time)
            shutil.rmtree(tmp_hf, ignore_errors=True)
            tmp_hf.mkdir()
            outs.append(SafetensorsShards(tmp_hf, layout, hf_max_shard_mb * 10**6))
        try:
            for name, t in weights:
                if t.is_floating_point() and not torch.isfinite(t).all():
                    bad.append(name)
                for out in outs:
                    out.put(name, t)
                size += t.numel() * t.element_size()
            for out in outs:
                out.finish()
        finally:
            for out in outs:
                out.close()
        if bad:
            raise RunFailed(f"refusing to write model.pt: the model holds non-finite weights ({', '.join(bad[:3])})")
        if hf_config is not None:
            _hf_directory(tmp_hf, None if sharded else tmp_st, hf_config)
            shutil.rmtree(run_dir / "hf", ignore_errors=True)  # (this run's own, from a launch that ended here)
            os.replace(tmp_hf, run_dir / "hf")
        os.replace(tmp_st, run_dir / "model.safetensors")
        os.replace(tmp, run_dir / "model.pt")
        write_json_atomic(run_dir / "summary.json", summary)
    except (OSError, RuntimeError, ValueError) as e:  # torch.save reports a short write as RuntimeError
        for t in (tmp, tmp_st):
            t.unlink(missing_ok=True)
        shutil.rmtree(tmp_hf, ignore_errors=True)
        if isinstance(e, RunFailed):
            raise
        raise RunFailed(write_error("model.pt and summary.json", run_dir, size, e)) from None


def _hf_directory(path: Path, weights: Path | None, config) -> None:
    """A directory from_pretrained loads: the model's config.json and its weights (a hard link to
    model.safetensors where the file system allows, else a copy; None: its shards are there already)."""
    if weights is None:
        config.save_pretrained(str(path))
        return
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    config.save_pretrained(str(path))
    try:
        os.link(weights, path / "model.safetensors")
    except OSError:
        shutil.copyfile(weights, path / "model.safetensors")


def is_complete(run_dir: Path) -> bool:
    return all((Path(run_dir) / f).exists() for f in ("model.pt", "summary.json"))


def counted_state(parts) -> int:
    """The model state at the second step's sync (or now, if the run took fewer), the strategy's own at its
    largest: DiLoCo's outer momentum is made by its first outer step, which may come later."""
    now = model_state_bytes(parts.model, parts.optimizer, parts.sync)
    then = parts.measure.model_state or now
    return then["total"] + max(0, now["sync"] - then["sync"])
