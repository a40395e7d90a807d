"""The training loop: one Trainer per rank, built from the config. Read top to bottom: __init__ builds the parts, fit()
runs epochs, _run_epoch() optimizer steps, _run_batch() one of them, evaluate() scores the held-out set across all
ranks, finish() writes the results. One object per concern: the Workload (data, task), StepMeasure, RunLogger,
Checkpointer, LossWatch, TimeToTarget, and the ReplicaSync (ddp_lab.sync), which keeps the replicas in agreement."""
from __future__ import annotations

import json
import logging
import sys
import time
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from ddp_lab.checkpoint import Checkpointer
from ddp_lab.checkpoint.state import own_state, restore, shared_state
from ddp_lab.distributed import DistEnv
from ddp_lab.guards import faults
from ddp_lab.guards.divergence import LossWatch
from ddp_lab.guards.preemption import Preemption, Terminated
from ddp_lab.models import build_model, check_sync_bn
from ddp_lab.sync import build_sync, eager_only
from ddp_lab.telemetry import position
from ddp_lab.telemetry.chance import warn_if_at_chance
from ddp_lab.telemetry.meter import Meter, flops_and_peak
from ddp_lab.telemetry.metrics import RunLogger, epoch_line, final_line
from ddp_lab.telemetry.profiling import StepProfiler
from ddp_lab.telemetry.step_measure import StepMeasure
from ddp_lab.telemetry.stragglers import StepTimer
from ddp_lab.telemetry.target import TimeToTarget
from ddp_lab.training.evaluation import evaluate
from ddp_lab.training.fast_path import amp_reason, autocast, resolve_amp, resolve_compile
from ddp_lab.training.optim import build_optimizer, build_schedule
from ddp_lab.training.results import is_complete, memory_scalars, run_summary, write_results
from ddp_lab.training.tasks import summary_name
from ddp_lab.training.workload import build_workload

log = logging.getLogger("ddp_lab")


class Trainer:
    def __init__(self, cfg, env: DistEnv, run_dir: Path, preemption: Preemption | None = None):
        self.cfg, self.env, self.run_dir = cfg, env, Path(run_dir)
        t = cfg.trainer
        self.preemption = preemption or Preemption(env.rank, t.preempt_save_s)  # not installed: never asks to save
        if t.threads > 0:  # (0: keep torch's, torchrun's 1)
            torch.set_num_threads(t.threads)
        self.amp = resolve_amp(t.amp, env.device)
        log.info(amp_reason(t.amp, self.amp, env.device))
        self.autocast = partial(autocast, self.amp, env.device)  # a context for the forward pass
        position.phase("loading data")  # every stretch of a rank's life is named (telemetry/position.py)
        self.work = build_workload(cfg.data, env, cfg.seed, model=cfg.model, trainer=t, optim=cfg.optim, sync=cfg.sync)
        self.train_loader, self.test_loader, self.task = self.work.loaders() + (self.work.task,)
        self.memory_format = torch.channels_last if self.work.channels_last else torch.contiguous_format
        self.steps_per_epoch = len(self.train_loader) // t.grad_accum
        total = self.steps_per_epoch * t.epochs
        self.total_steps = min(total, t.max_steps) if t.max_steps > 0 else total
        self.cut = self.total_steps < total  # trainer.max_steps ends the run before its epochs do
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        position.phase("building the model")
        self.model = build_model(cfg.model).to(env.device, memory_format=self.memory_format)
        check_sync_bn(self.model, env.distributed, env.device)
        step_samples = t.grad_accum * self.train_loader.batch_size  # a rank's, in a whole step
        n = self.total_steps * step_samples
        self.compiled, why = resolve_compile(t.compile, env.device, n, eager_only(cfg.sync))
        log.info(why)
        # the FLOP count runs the model once: before the sync's hooks (zero stage 3 would gather for it)
        self.meter = Meter(env, t.warmup_steps, *flops_and_peak(self.model, self.work.input_example, self.amp, env),
                           full_step_images=step_samples, task=self.task,
                           targets_per_sample=self.work.targets_per_sample)
        # DDP wraps the compiled model: compiling DDP breaks its forward's graph (and slowed CPU LeNet)
        net = torch.compile(self.model) if self.compiled else self.model
        self.sync = build_sync(cfg.sync, net, env)
        self.forward = self.sync.module
        self.optimizer = build_optimizer(cfg.optim, self.sync.parameters())  # (zero: this rank's shard)
        self.scheduler = build_schedule(self.optimizer, cfg.optim, self.steps_per_epoch, self.total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == "fp16")
        # ranks whose weights or gradients differ after the sync compare losses instead
        apart, lr = self.sync.caps.diverges, self.optimizer.defaults.get("lr", 0.0)
        self.loss_watch = LossWatch(env, cfg.sync.every if apart else t.log_every, lr, self.amp,
                                    None if apart or self.sync.caps.shards else self.model.parameters())
        self.target = TimeToTarget(t, self.task.name)  # trainer.target_acc/_loss, eval_every_steps
        self.profiler = StepProfiler(t.profile, t.profile_wait, t.profile_active, self.run_dir,
                                     env.rank, env.device.type == "cuda")
        timer = StepTimer(self.model, env) if t.measure == "full" else None  # stragglers: a hook per parameter
        self.measure = StepMeasure(t.measure, self.meter, self.sync, self.profiler, timer, (self.model, self.optimizer))
        self.step = self.epoch = self.batches_done = 0  # batches: of the current epoch
        self.saved_step, self.saved_path = -1, None  # the newest checkpoint this launch wrote
        self.stepped = False  # whether this process has taken a step yet
        self.last: dict[str, float] = {}  # the newest metrics, for summary.json
        self.last_eval: tuple[int, dict] = (-1, {})  # (step, figures) of the newest evaluation
        self.world_sizes = [[0, env.world_size]]  # [step, ranks] at every change
        self.checkpointer = Checkpointer(cfg, env, self.run_dir)
        position.phase("resuming")
        self.resumed = self.checkpointer.resume()  # last: it overwrites state (and RNG) built above
        if self.resumed is not None:
            self.load_state_dict(self.resumed.shared, self.resumed.own)
        # resumed at step S: an earlier attempt's events after S are hidden in TensorBoard
        self.log = RunLogger(self.run_dir, env.is_main, purge_step=self.step + 1 if self.resumed else None)
        if self.resumed is not None:
            self.log.print(self.resumed.describe(self.step, self._position(), env.world_size))
        if not self._already_complete():
            self.checkpointer.record_launch()  # from here on, this launch writes into run_dir
        self.loss_fn = faults.install(env.rank, self.measure, self.sync, self.task.loss)  # (wraps: DDP_LAB_FAULT)

    # ------------------------------------------------------------ the loop
    def fit(self) -> dict:
        if self._already_complete():
            self.log.print(f"{self.run_dir} holds a complete run (step {self.step} of "
                           f"{self.total_steps}): nothing left to do, nothing written")
            return json.loads((self.run_dir / "summary.json").read_text())
        self.log.config(self.cfg)
        self.log.scalars({"dist/world_size": self.env.world_size}, self.step)
        # (batches_done > 0 when done: resumed from the save that max_steps made mid-epoch)
        while self.epoch < self.cfg.trainer.epochs and (not self.done or self.batches_done > 0):
            self._end_epoch(self._run_epoch(self.epoch))
        return self.finish()

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps or self.target.stop

    def _run_epoch(self, epoch: int) -> dict:
        """One pass over this rank's shard (from batch batches_done when resumed mid-epoch)."""
        self.model.train()
        self.meter.start_epoch()
        show = self.env.is_main and self.cfg.trainer.progress and sys.stderr.isatty()
        bar = tqdm(total=self.steps_per_epoch, initial=self.batches_done // self.cfg.trainer.grad_accum,
                   desc=f"epoch {epoch + 1}", leave=False, disable=not show)
        for micro in self._optimizer_steps(epoch):
            self.target.start()
            self._run_batch(micro)
            self.step += 1
            self.batches_done += len(micro)
            self.measure.step_done()
            bar.update()
            self._after_step()
            self.measure.step_closed(self.step)
            if self.preemption.stop_here(self.step) and not self.done:
                self._save_and_stop()
        bar.close()
        return self.meter.end_epoch(self.scheduler.get_last_lr()[0], self.sync)

    def _optimizer_steps(self, epoch: int):
        """Lists of grad_accum micro-batches, one per optimizer step, until the epoch
        runs out of them or the run reaches total_steps."""
        k = self.cfg.trainer.grad_accum
        batches = self.train_loader.epoch(epoch, start=self.batches_done)
        while not self.done:
            position.phase("data loading")
            t0 = time.perf_counter()  # the host's wait for data: no device sync
            micro = [b for _, b in zip(range(k), batches)]
            self.meter.data_seconds += time.perf_counter() - t0
            if len(micro) < k:
                return
            yield micro

    def _run_batch(self, micro: list) -> None:
        """One optimizer step over k micro-batches; only the last one communicates (but under zero stages 2, 3)."""
        position.at_step(self.step + 1)
        # a compiled model's first step in this process builds its kernels
        position.phase("compile" if self.compiled and not self.stepped else "forward/backward")
        self.stepped = True
        self.measure.step_starts(sum(len(y) for _, y in micro))
        self.last_loss = 0.0  # the step's: the mean over its micro-batches
        for i, (x, y) in enumerate(micro):
            with self.sync.during_backward(last=i == len(micro) - 1):
                with self.autocast():
                    out = self.forward(x)
                loss = self.loss_fn(out, y)
                self.scaler.scale(loss / len(micro)).backward()
            self.measure.batch_done(loss, out, y)
            self.last_loss = self.last_loss + loss.detach() / len(micro)
        self.sync.after_backward()
        position.phase("optimizer step")
        self.measure.synced()
        if self.cfg.optim.clip_grad_norm > 0:  # on the unscaled gradients (fp16)
            self.scaler.unscale_(self.optimizer)
            self.sync.clip_grad_norm(self.cfg.optim.clip_grad_norm)
        self.loss_watch.observe(self.last_loss, self.step + 1)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.sync.caps.grads_set_to_none)
        self.scheduler.step()
        self.sync.after_step(self.step + 1)  # local_sgd, diloco: the weights travel here

    def _after_step(self) -> None:
        position.phase("logging")
        if self.step % self.cfg.trainer.log_every == 0:
            self.log.scalars({"loss/train_step": self.last_loss.item(),
                              "lr": self.scheduler.get_last_lr()[0],
                              **self.measure.log_step()}, self.step)
        if self.target.due(self.step):
            self.log.scalars(self._evaluate(), self.step)
        if self.checkpointer.due(self.step, self.done, self._epoch_exhausted()):
            self._save_checkpoint()

    def _end_epoch(self, metrics: dict) -> None:
        t = self.cfg.trainer
        if self.done:  # local_sgd, diloco: the same final weights on every rank
            self.sync.finish(self.step)
        unevaluated = self.last_eval[0] != self.step  # (else evaluated after this step, and logged)
        if not unevaluated or self.epoch + 1 == t.epochs or self.done or (
                t.eval_every > 0 and (self.epoch + 1) % t.eval_every == 0):
            if unevaluated:
                metrics.update(self._evaluate())
            at = (self.step, self.total_steps) if self.cut and self.done else None  # cut: count steps
            self.log.print(epoch_line(self.epoch, t.epochs, {**metrics, **self.last_eval[1]}, self.task, at))
        self.log.scalars(metrics, self.step)
        self.last.update(metrics)
        complete = self._epoch_exhausted()  # else max_steps cut it (saved in the loop)
        self.epoch += 1
        self.batches_done = 0
        if complete:
            self._save_checkpoint()

    # ------------------------------------------------------------ checkpoints
    def _epoch_exhausted(self) -> bool:
        """Too few batches left in this epoch for another optimizer step."""
        return self.batches_done + self.cfg.trainer.grad_accum > len(self.train_loader)

    def state_dict(self, model: dict) -> dict:
        """What rank 0 saves: everything every rank shares (ddp_lab.checkpoint.state)."""
        return shared_state(self, model)

    def load_state_dict(self, shared: dict, own: dict) -> None:
        restore(self, shared, own)

    def _save_checkpoint(self) -> Path | None:
        """Every rank calls this at the same step; see ddp_lab.checkpoint for the layout."""
        self.meter.throughput.pause()  # saving is not training: keep it out of img/s
        self.loss_watch.check()  # never save weights a diverged step produced
        model = self.sync.model_state_dict(self.model)  # (sharded weights: every rank gathers them for rank 0)
        path = self.checkpointer.save(self.step, self.state_dict(model) if self.env.is_main else None, own_state(self))
        if path is not None:
            self.log.print(f"checkpoint {path.name} ({self._position()})")
        self.meter.throughput.resume()
        self.saved_step, self.saved_path = self.step, path
        return path

    def _save_and_stop(self) -> None:
        """At the step agreed after a signal: save (unless this step's is written) and exit 128 + the signal."""
        path = self.saved_path if self.saved_step == self.step else self._save_checkpoint()
        self.preemption.report_save(path)  # its line; the poll thread stopped
        raise Terminated(self.preemption.exit_code)

    def _position(self) -> str:
        mid = f"epoch {self.epoch + 1}, batch {self.batches_done}"
        return mid if self.batches_done else f"end of epoch {self.epoch}"

    def _already_complete(self) -> bool:
        """Resumed where the run had already ended and written its results: write nothing."""
        return self.resumed is not None and self.done and is_complete(self.run_dir)

    def evaluate(self) -> tuple[float, int, int]:
        """Exact held-out (loss sum, correct, targets) of the weights the ranks agree on (sync.consensus)."""
        self.meter.throughput.pause()
        lockstep = self.work.input_example if self.sync.caps.forward_gathers else None  # (zero 3, fsdp: see evaluate)
        with self.sync.consensus():
            return evaluate(self.model, self.test_loader, self.env, self.task, self.autocast, lockstep)

    def _evaluate(self) -> dict:
        """Evaluate now: the held-out figures, also logged against time; the target judged."""
        t0, split = time.perf_counter(), self.task.held_out
        loss_sum, correct, total = self.evaluate()
        metrics = self.task.metrics(loss_sum, correct, total, split)
        if self.last_eval[0] < 0 and self.env.is_main:  # a classifier still at chance at its first evaluation
            warn_if_at_chance(metrics, self.task, self.work.classes, getattr(self, "last_loss", None),
                              self.optimizer.defaults.get("lr"))
        judged = self.sync.synced_at(self.step)  # where the ranks hold the weights evaluated (local_sgd, diloco)
        if self.target.evaluated(metrics, split, time.perf_counter() - t0, self.step, judged, self.sync.counts()):
            self.log.print(f"target reached at step {self.step}, {self.target.reached['seconds']:.1f} s")
        self.log.scalars(*self.target.by_time(metrics))
        self.last_eval = (self.step, metrics)
        self.last.update({**metrics, f"{split}_correct": int(correct), f"{split}_total": int(total)})
        return metrics

    # ------------------------------------------------------------ the end
    def finish(self) -> dict:
        """summary.json and model.pt (rank 0), the closing line; every rank returns the summary."""
        self.loss_watch.check()
        position.phase("writing results")
        summary = run_summary(self)
        headline = summary_name(self.task.headline)
        self.log.hparams(self.cfg, self.env.world_size, summary["backend"],
                         {k: summary[k] for k in (headline, "train_loss", "samples_per_sec")})
        self.log.scalars(memory_scalars(summary), self.step)  # every rank's model state and peak memory
        model = self.sync.model_state_dict(self.model)
        if self.env.is_main:
            write_results(self.run_dir, model, summary)
        self.log.print(final_line(summary, headline))
        return summary

    def close(self) -> None:
        self.profiler.close()
        self.log.close()
        self.sync = self.forward = None  # DDP's Python comm hook before the process group: else aborts at exit
