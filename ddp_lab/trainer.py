"""The training loop: one Trainer per rank, built from the config.

Read top to bottom: __init__ builds the parts from config, fit() runs epochs,
_run_epoch() runs batches, _run_batch() is one optimizer step, evaluate()
counts correct test images across all ranks.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from torch import nn
from tqdm import tqdm

from ddp_lab import checkpoint
from ddp_lab.config import ConfigError
from ddp_lab.data import build_loaders
from ddp_lab.distributed import DistEnv, all_reduce_sum
from ddp_lab.fast_path import resolve_amp, resolve_compile
from ddp_lab.metrics import Clock, RunLogger, Throughput, epoch_line, final_line, peak_memory_mb
from ddp_lab.models import build_model
from ddp_lab.profiling import StepProfiler
from ddp_lab.sync import build_sync

log = logging.getLogger("ddp_lab")


def build_optimizer(cfg, params):
    """The optimizer `cfg` (the optim group) names; the schedule keys are ddp_lab's own."""
    args = {k: v for k, v in cfg.items() if k not in ("schedule", "warmup_epochs")}
    try:
        return instantiate(args, params=params)
    except InstantiationException as e:
        # torch.optim checks its own arguments ("Invalid learning rate: -1.0"): pass that on
        if isinstance(e.__cause__, ValueError):
            raise ConfigError(f"optim: {cfg._target_} refused these settings: {e.__cause__} "
                              "(fix the optim.* value it names)") from None
        raise


def build_schedule(optimizer, cfg, steps_per_epoch: int, total_steps: int):
    """Per-step learning-rate multiplier: linear warm-up, then constant or cosine decay."""
    if cfg.schedule not in ("constant", "cosine"):
        raise ConfigError(f"optim.schedule={cfg.schedule!r} is not one of constant, cosine")
    if cfg.warmup_epochs < 0:
        raise ConfigError(f"optim.warmup_epochs={cfg.warmup_epochs} must be >= 0 (0: no warm-up)")
    warmup = int(cfg.warmup_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fault_from_env() -> dict | None:
    """DDP_LAB_FAULT="rank=1,step=5,kind=raise" makes one rank fail on purpose after
    that optimizer step, to watch how a job fails and recovers: kind=raise (an
    exception) or kind=kill (SIGKILL, as the OOM killer would). It fires on a
    launch's first attempt only (TORCHELASTIC_RESTART_COUNT=0), so that a
    torchrun restart (--max-restarts) then runs clean.
    """
    spec = os.environ.get("DDP_LAB_FAULT")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return None
    try:
        fault = dict(part.split("=", 1) for part in spec.split(","))
        fault = {"rank": int(fault["rank"]), "step": int(fault["step"]), "kind": fault["kind"]}
    except (KeyError, ValueError) as e:
        raise ConfigError(f"DDP_LAB_FAULT={spec!r}: expected rank=R,step=N,kind=raise|kill") from e
    if fault["kind"] not in ("raise", "kill"):
        raise ConfigError(f"DDP_LAB_FAULT={spec!r}: kind must be raise or kill")
    return fault


class Trainer:
    def __init__(self, cfg, env: DistEnv, run_dir: Path):
        self.cfg, self.env, self.run_dir = cfg, env, Path(run_dir)
        t = cfg.trainer
        for key in ("epochs", "log_every", "grad_accum"):
            if t[key] < 1:
                raise ConfigError(f"trainer.{key}={t[key]} must be >= 1")
        for key in ("ckpt_every", "keep_ckpts", "max_steps", "warmup_steps", "eval_every", "threads"):
            if t[key] < 0:
                raise ConfigError(f"trainer.{key}={t[key]} must be >= 0")
        if t.threads > 0:
            torch.set_num_threads(t.threads)
        self.amp = resolve_amp(t.amp, env.device)
        self.memory_format = torch.channels_last if t.channels_last else torch.contiguous_format

        self.train_loader, self.test_loader = build_loaders(
            cfg.data, env.rank, env.world_size, env.device, cfg.seed, t.channels_last)
        channels = cfg.data.image_shape[0] if cfg.data.name == "synthetic" else 1
        if channels != cfg.model.in_channels:
            raise ConfigError(f"model.in_channels={cfg.model.in_channels} but the data has "
                              f"{channels} channel(s); set model.in_channels={channels}")

        self.steps_per_epoch = len(self.train_loader) // t.grad_accum
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"trainer.grad_accum={t.grad_accum} takes {t.grad_accum} batches per optimizer "
                f"step, but each rank has only {len(self.train_loader)} per epoch: lower "
                f"trainer.grad_accum (or data.batch_size)")
        total = self.steps_per_epoch * t.epochs
        self.total_steps = min(total, t.max_steps) if t.max_steps > 0 else total

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = build_model(cfg.model).to(env.device, memory_format=self.memory_format)
        if env.distributed and env.device.type == "cpu" and any(
                isinstance(m, nn.SyncBatchNorm) for m in self.model.modules()):
            raise ConfigError("model.sync_bn=true needs GPU ranks: torch's SyncBatchNorm does not "
                              "run on CPU. Set model.sync_bn=false (each rank then normalises "
                              "with its own batch's statistics)")
        images_per_rank = self.total_steps * t.grad_accum * self.train_loader.batch_size
        self.compiled, why = resolve_compile(t.compile, env.device, images_per_rank)
        log.info(why)
        # Compile the bare model and let DDP wrap the compiled one: compiling the
        # DDP wrapper instead breaks the graph inside DDP's forward and, with
        # 1 thread per rank on CPU, made LeNet steps slower than eager.
        net = torch.compile(self.model) if self.compiled else self.model
        self.sync = build_sync(cfg.sync, net, env)
        self.forward = self.sync.module
        self.optimizer = build_optimizer(cfg.optim, self.model.parameters())
        self.scheduler = build_schedule(self.optimizer, cfg.optim, self.steps_per_epoch, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == "fp16")
        self.loss_fn = nn.CrossEntropyLoss()

        self.clock = Clock(env.device)
        self.throughput = Throughput(self.clock, t.warmup_steps)
        self.log = RunLogger(self.run_dir, env.is_main)
        self.profiler = StepProfiler(t.profile, t.profile_wait, t.profile_active, self.run_dir,
                                     env.rank, env.device.type == "cuda")
        self.step = 0  # optimizer steps taken
        self.epoch = 0
        self.epoch_seconds: list[float] = []
        self.data_seconds = 0.0
        self.last: dict[str, float] = {}
        self.batches_done = 0  # loader batches of the current epoch already trained on
        self.resumed_sums: torch.Tensor | None = None  # a resumed epoch's running sums
        self.ckpt_root = self.run_dir / checkpoint.DIRNAME
        self.fault = fault_from_env()
        self._maybe_resume()  # last: it overwrites state (and RNG) built above

    def autocast(self):
        if self.amp == "off":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.amp == "bf16" else torch.float16
        return torch.autocast(self.env.device.type, dtype=dtype)

    # ------------------------------------------------------------ the loop
    def fit(self) -> dict:
        self.log.config(self.cfg)
        t = self.cfg.trainer
        # (batches_done > 0 when done: resumed from the save that max_steps made mid-epoch,
        # whose epoch still needs its metrics and evaluation)
        while self.epoch < t.epochs and (not self.done or self.batches_done > 0):
            metrics = self._run_epoch(self.epoch)
            last_epoch = self.epoch + 1 == t.epochs or self.done
            if last_epoch or (t.eval_every > 0 and (self.epoch + 1) % t.eval_every == 0):
                correct, total = self.evaluate()
                metrics["acc/test"] = correct / total
                self.last.update(test_correct=correct, test_total=total)
            self.log.scalars(metrics, self.step)
            if "acc/test" in metrics:
                self.log.print(epoch_line(self.epoch, t.epochs, metrics))
            self.last.update(metrics)
            complete = self._epoch_exhausted()  # else max_steps cut it (saved in the loop)
            self.epoch += 1
            self.batches_done = 0
            if complete:
                self._save_checkpoint()
        return self.finish()

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def _run_epoch(self, epoch: int) -> dict:
        self.model.train()
        t = self.cfg.trainer
        sums = torch.zeros(3, dtype=torch.float64, device=self.env.device)  # loss*n, correct, n
        if self.resumed_sums is not None:  # resumed mid-epoch: the epoch's metrics go on
            sums.copy_(self.resumed_sums)
            self.resumed_sums = None
        images0, seconds0 = self.throughput.images, self.throughput.seconds
        bar = tqdm(total=self.steps_per_epoch, initial=self.batches_done // t.grad_accum,
                   desc=f"epoch {epoch + 1}", leave=False,
                   disable=not (self.env.is_main and t.progress and sys.stderr.isatty()))
        start = self.clock.now()
        self.throughput.resume()
        batches = self.train_loader.epoch(epoch, start=self.batches_done)
        while not self.done:
            micro = self._next_micro_batches(batches, t.grad_accum)
            if micro is None:
                break
            # count communication over the steps the throughput window counts
            self.sync.measuring = self.throughput.seen >= self.throughput.warmup
            self._run_batch(micro, sums)
            self.step += 1
            self.batches_done += len(micro)
            self.throughput.step_done(sum(len(y) for _, y in micro) * self.env.world_size)
            self.profiler.step()
            bar.update()
            if self.step % t.log_every == 0:
                self.log.scalars({"loss/train_step": self.last_loss.item(),
                                  "lr": self.scheduler.get_last_lr()[0]}, self.step)
            if self._step_checkpoint_due():
                self.throughput.pause()  # saving is not training: keep it out of img/s
                self._save_checkpoint(sums)
                self.throughput.resume()
            self._maybe_inject_fault()
        self.throughput.pause()
        bar.close()
        seconds = self.clock.now() - start
        self.epoch_seconds.append(seconds)

        all_reduce_sum(sums, self.env)
        loss_sum, correct, n = sums.tolist()
        images = self.throughput.images - images0
        window = self.throughput.seconds - seconds0
        rate = images / window if window > 0 else float("nan")
        return {
            "loss/train": loss_sum / max(n, 1),
            "acc/train": correct / max(n, 1),
            "perf/samples_per_sec": rate,
            "perf/samples_per_sec_per_rank": rate / self.env.world_size,
            "perf/step_ms": self.throughput.step_ms,
            "perf/data_ms": 1000 * self.data_seconds / max(self.step, 1),
            "perf/epoch_s": seconds,
            "lr": self.scheduler.get_last_lr()[0],
            **self._comm_metrics(),
        }

    def _comm_metrics(self) -> dict:
        """perf/comm_ms per step and perf/comm_frac of the step, over the throughput
        window so far (like perf/step_ms); absent where not measured (see ddp_lab.sync)."""
        ms, frac = self.sync.comm_figures(self.throughput.steps, self.throughput.seconds)
        return {} if math.isnan(ms) else {"perf/comm_ms": ms, "perf/comm_frac": frac}

    def _next_micro_batches(self, batches, k: int):
        """k micro-batches for one optimizer step, or None when the epoch is out of data."""
        t0 = time.perf_counter()
        micro = []
        for _ in range(k):
            b = next(batches, None)
            if b is None:
                break
            micro.append(b)
        self.data_seconds += time.perf_counter() - t0
        return micro if len(micro) == k else None

    def _run_batch(self, micro: list, sums: torch.Tensor) -> None:
        """One optimizer step over k micro-batches; only the last one communicates."""
        for i, (x, y) in enumerate(micro):
            last = i == len(micro) - 1
            with (contextlib.nullcontext() if last else self.sync.no_sync()):
                with self.autocast():
                    out = self.forward(x)
                loss = self.loss_fn(out.float(), y)
                self.scaler.scale(loss / len(micro)).backward()
            with torch.no_grad():
                sums[0] += loss.detach() * len(y)
                sums[1] += (out.argmax(1) == y).sum()
                sums[2] += len(y)
        self.last_loss = loss.detach()
        self.sync.after_backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.sync.grads_set_to_none)
        self.scheduler.step()

    # ------------------------------------------------------------ checkpoints
    def _epoch_exhausted(self) -> bool:
        """Too few batches left in this epoch for another optimizer step."""
        return self.batches_done + self.cfg.trainer.grad_accum > len(self.train_loader)

    def _step_checkpoint_due(self) -> bool:
        """Every trainer.ckpt_every steps, and where max_steps stops mid-epoch (so that
        trainer.resume can finish the epoch later); at an epoch's end fit() saves instead."""
        if self._epoch_exhausted():
            return False
        every = self.cfg.trainer.ckpt_every
        return self.done or (every > 0 and self.step % every == 0)

    def _save_checkpoint(self, sums: torch.Tensor | None = None) -> None:
        """Every rank calls this at the same step; see ddp_lab.checkpoint for the layout."""
        t = self.cfg.trainer
        if t.keep_ckpts == 0:
            return
        own = {"rng": checkpoint.rng_state(self.env.device), "step": self.step,
               "batches_done": self.batches_done,
               "sums": (sums if sums is not None else torch.zeros(3, dtype=torch.float64)).cpu()}
        shared = meta = None
        if self.env.is_main:
            shared = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                      "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                      "step": self.step, "epoch": self.epoch, "batches_done": self.batches_done,
                      "sampler_seed": self.cfg.seed, "world_size": self.env.world_size,
                      "total_steps": self.total_steps,
                      "last": dict(self.last), "epoch_seconds": list(self.epoch_seconds)}
            subset = checkpoint.config_subset(self.cfg)
            meta = {"epoch": self.epoch, "batches_done": self.batches_done,
                    "config_hash": checkpoint.config_hash(subset), "config": subset}
        path = checkpoint.save(self.ckpt_root, self.step, self.env, own, shared, meta, t.keep_ckpts)
        self.log.print(f"checkpoint {path.name} ({self._position()})")

    def _position(self) -> str:
        if self.batches_done == 0:
            return f"end of epoch {self.epoch}"
        return f"epoch {self.epoch + 1}, batch {self.batches_done}"

    def _maybe_resume(self) -> None:
        """Continue from a checkpoint after a torchrun restart, or as trainer.resume says."""
        path = checkpoint.choose(self.cfg.trainer.resume, self.ckpt_root, self.env)
        if path is None:
            return
        checkpoint.validate(path, checkpoint.read_meta(path), self.env.world_size,
                            checkpoint.config_subset(self.cfg))
        shared, own = checkpoint.load(path, self.env.rank, self.env.device)
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        self.scheduler.load_state_dict(shared["scheduler"])
        self.scaler.load_state_dict(shared["scaler"])
        self.step, self.epoch = shared["step"], shared["epoch"]
        self.batches_done = shared["batches_done"]
        self.last, self.epoch_seconds = dict(shared["last"]), list(shared["epoch_seconds"])
        self.resumed_sums = own["sums"].to(self.env.device)
        if shared["total_steps"] != self.total_steps and self.cfg.optim.schedule == "cosine":
            log.warning("the cosine schedule was planned over %d steps, now over %d "
                        "(trainer.max_steps changed): the learning rate curve changes from here",
                        shared["total_steps"], self.total_steps)
        checkpoint.set_rng_state(own["rng"], self.env.device)
        self.log.print(f"resumed from {path} (step {self.step}, {self._position()})")

    def _maybe_inject_fault(self) -> None:
        """DDP_LAB_FAULT (see fault_from_env): fail on purpose after the chosen step."""
        f = self.fault
        if f is None or f["rank"] != self.env.rank or f["step"] != self.step:
            return
        if f["kind"] == "kill":
            # A SIGKILLed rank leaves no traceback, and torchrun may name another rank's
            # failure first (the rank that hit the dead peer): say what happened here.
            print(f"DDP_LAB_FAULT: rank {self.env.rank} sends itself SIGKILL after step "
                  f"{self.step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"DDP_LAB_FAULT: rank {self.env.rank} fails after step {self.step}")

    # ------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> tuple[int, int]:
        """Exact test accuracy: each rank counts its own disjoint shard, counts are summed."""
        self.throughput.pause()
        self._broadcast_buffers()
        self.model.eval()
        counts = torch.zeros(2, dtype=torch.int64, device=self.env.device)
        for x, y in self.test_loader.epoch(0):
            with self.autocast():
                out = self.model(x)
            counts[0] += (out.argmax(1) == y).sum()
            counts[1] += len(y)
        all_reduce_sum(counts, self.env)
        self.model.train()
        correct, total = counts.tolist()
        return correct, total

    def _broadcast_buffers(self) -> None:
        # BatchNorm running statistics drift apart per rank; evaluate rank 0's on all.
        if self.env.distributed:
            for b in self.model.buffers():
                dist.broadcast(b, src=0)

    # ------------------------------------------------------------ the end
    def finish(self) -> dict:
        cfg, env, last = self.cfg, self.env, self.last
        rate = self.throughput.per_sec
        # over the same post-warm-up window as samples_per_sec; null where not measured
        comm_ms, comm_frac = self.sync.comm_figures(self.throughput.steps, self.throughput.seconds)
        summary = {
            "test_acc": last["acc/test"], "test_correct": last["test_correct"],
            "test_total": last["test_total"], "train_loss": last["loss/train"],
            "train_acc": last["acc/train"], "samples_per_sec": rate,
            "samples_per_sec_per_rank": rate / env.world_size,
            "sec_per_epoch": sum(self.epoch_seconds) / len(self.epoch_seconds),
            "step_ms": self.throughput.step_ms,
            "data_ms": 1000 * self.data_seconds / max(self.step, 1),
            "epochs": self.epoch, "steps": self.step, "world_size": env.world_size,
            "backend": env.backend if env.distributed else "none",
            "comm_threads": env.comm_threads, "device": env.device.type,
            "model": cfg.model.name, "sync": self.sync.describe(),
            "global_batch": cfg.data.batch_size, "amp": self.amp, "seed": cfg.seed,
            "threads": torch.get_num_threads(), "compile": self.compiled,
            "measured_steps": self.throughput.steps,
            "comm_timing": self.sync.comm_timing,
            "comm_ms_per_step": comm_ms, "comm_frac": comm_frac,
            "peak_mem_mb": peak_memory_mb(env.device),  # rank 0's process (ranks are alike)
        }
        self.log.hparams(cfg, env.world_size, summary["backend"],
                         {k: summary[k] for k in ("test_acc", "train_loss", "samples_per_sec")})
        self.log.summary(summary)
        if env.is_main:  # temp name + rename: a kill mid-save never leaves half a model.pt
            tmp = self.run_dir / ".model.pt.tmp"
            torch.save(self.model.state_dict(), tmp)
            os.replace(tmp, self.run_dir / "model.pt")
        self.log.print(final_line(summary))
        return summary

    def close(self) -> None:
        self.profiler.close()
        self.log.close()
