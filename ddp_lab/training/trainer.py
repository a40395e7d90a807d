"""The training loop: one Trainer per rank, running the parts the builder made (training/builder.py).

Read top to bottom: fit() runs epochs, _run_epoch() optimizer steps, _run_batch() one of them (the step
alone: forward, loss, backward, sync, optimizer); what happens around a step (measuring, position marks,
the loss check, logging, evaluation, checkpoints, faults, preemption) hangs on the step callbacks
(training/callbacks.py), which observe it, and when to evaluate and save is the schedule's answer
(training/schedule.py). evaluate() scores the held-out set across all ranks, finish() writes the results.
The Trainer never sees the config: what it reads is in the parts, as plain values (the plan).
"""
from __future__ import annotations

import json
import logging
import sys
import time
from functools import partial
from pathlib import Path

from tqdm import tqdm

from ddp_lab.checkpoint.state import peer_state, restore, restore_from_peer, states
from ddp_lab.distributed import DistEnv
from ddp_lab.guards.preemption import Preemption, Terminated
from ddp_lab.models.calling import call
from ddp_lab.models.hf import config_of
from ddp_lab.telemetry import position
from ddp_lab.telemetry.chance import warn_if_at_chance
from ddp_lab.telemetry.metrics import RunLogger, epoch_line, final_line
from ddp_lab.training.builder import Parts, build
from ddp_lab.training.evaluation import evaluate
from ddp_lab.training.results import is_complete, memory_scalars, run_summary, write_results
from ddp_lab.training.tasks import summary_name

log = logging.getLogger("ddp_lab")


class Trainer:
    def __init__(self, parts: Parts):
        p = self.parts = parts
        self.env, self.run_dir = p.env, p.run_dir
        self.amp, self.autocast, self.compiled = p.amp, p.autocast, p.compiled
        self.work, self.task, self.loss = p.work, p.work.task, p.loss
        self.plan, self.schedule, self.progress = p.plan, p.plan.schedule, p.progress
        self.train_loader, self.test_loader = p.work.train_loader, p.work.test_loader
        self.model, self.sync, self.forward = p.model, p.sync, p.sync.module
        self.optimizer, self.scheduler, self.scaler = p.optimizer, p.scheduler, p.scaler
        self.meter, self.measure, self.profiler, self.target = p.meter, p.measure, p.profiler, p.target
        self.loss_watch, self.checkpointer, self.preemption = p.loss_watch, p.checkpointer, p.preemption
        self.callbacks = p.callbacks
        self.stepped = False  # whether this process has taken a step yet
        self.saved_step, self.saved_path = -1, None  # the newest checkpoint this launch wrote
        self.last_eval: tuple[int, dict] = (-1, {})  # (step, figures) of the newest evaluation
        said = self._resume_and_join()  # last: it overwrites state (and RNG) built above
        # resumed at step S: an earlier attempt's events after S are hidden in TensorBoard
        self.log = RunLogger(self.run_dir, self.env.is_main, purge_step=self.step + 1 if self.resumed else None)
        for line in said:
            self.log.print(line)
        if not self._already_complete():
            self.checkpointer.record_launch()  # from here on, this launch writes into run_dir

    def _resume_and_join(self) -> list[str]:
        """This launch's state: a checkpoint's where it continues a run, then a peer's where it is an island
        behind the others (sync.fault_tolerance=torchft); the lines that say so."""
        position.phase("resuming")
        self.resumed, said = self.checkpointer.resume(), []
        if self.resumed is not None:
            self.load_state_dict(self.resumed.shared, self.resumed.own)
            # the loaded tensors go (a sharded rank's own weights: as many bytes as its shards)
            self.resumed = self.resumed._replace(shared={}, own={})
            said.append(self.resumed.describe(self.step, self._position(), self.env.world_size))
        position.phase("joining the other islands")
        config = self.checkpointer.subset  # (what must match, as for a checkpoint)
        healed = self.sync.join(partial(peer_state, self.parts, config),
                                partial(restore_from_peer, self.parts, config=config), self.step)
        if healed is not None:
            said.append(f"rejoined from a peer island at step {self.step} ({self._position()}): its weights, "
                        f"optimizer and outer state, schedule and data position, {healed['seconds']:.1f} s after it "
                        f"asked (the others' next round, the transfer)" + ("" if self.resumed else
                                                                           "; nothing read from disk"))
        return said

    @classmethod
    def from_config(cls, cfg, env: DistEnv, run_dir: Path, preemption: Preemption | None = None) -> Trainer:
        return cls(build(cfg, env, Path(run_dir), preemption))

    # where the run is (Progress: checkpointed, read by summary.json)
    step = property(lambda self: self.progress.step)
    epoch = property(lambda self: self.progress.epoch)
    batches_done = property(lambda self: self.progress.batches_done)
    total_steps = property(lambda self: self.plan.total_steps)
    steps_per_epoch = property(lambda self: self.plan.steps_per_epoch)
    cut = property(lambda self: self.plan.cut)
    last = property(lambda self: self.progress.last)

    # ------------------------------------------------------------ the loop
    def fit(self) -> dict:
        if self._already_complete():
            self.log.print(f"{self.run_dir} holds a complete run (step {self.step} of "
                           f"{self.total_steps}): nothing left to do, nothing written")
            return json.loads((self.run_dir / "summary.json").read_text())
        self.log.config(self.parts.config_record)
        self.log.scalars({"dist/world_size": self.env.world_size}, self.step)
        # (batches_done > 0 when done: resumed from the save that max_steps made mid-epoch)
        while self.epoch < self.plan.epochs and (not self.done or self.batches_done > 0):
            self._end_epoch(self._run_epoch(self.epoch))
        return self.finish()

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps or self.target.stop

    def _run_epoch(self, epoch: int) -> dict:
        """One pass over this rank's shard (from batch batches_done when resumed mid-epoch)."""
        self.model.train()
        self.meter.start_epoch()
        show = self.env.is_main and self.plan.progress_bar and sys.stderr.isatty()
        bar = tqdm(total=self.steps_per_epoch, initial=self.batches_done // self.plan.grad_accum,
                   desc=f"epoch {epoch + 1}", leave=False, disable=not show)
        for micro in self._optimizer_steps(epoch):
            self.callbacks.step_start(self, micro)
            self._run_batch(micro)
            self.progress.step += 1
            self.progress.batches_done += len(micro)
            self.sync.counted(self.step)  # (torchft islands: a round's start, where the islands present meet)
            bar.update()
            self.callbacks.step_end(self)  # logging, evaluation, checkpoint, faults, preemption
        bar.close()
        return self.meter.end_epoch(self.scheduler.get_last_lr()[0], self.sync)

    def _optimizer_steps(self, epoch: int):
        """Lists of grad_accum micro-batches, one per optimizer step, until the epoch
        runs out of them or the run reaches total_steps."""
        k = self.plan.grad_accum
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
        self.stepped, self.last_loss = True, 0.0  # the step's loss: the mean over its micro-batches
        for i, (x, y) in enumerate(micro):
            with self.sync.during_backward(last=i == len(micro) - 1):
                with self.autocast():
                    out = call(self.forward, x)  # (a dict batch: by keyword)
                loss = self.loss(out, y)
                self.scaler.scale(loss / len(micro)).backward()
            self.callbacks.batch_done(self, loss, out, y)
            self.last_loss = self.last_loss + loss.detach() / len(micro)
        self.sync.after_backward()
        self.grad_norm = None  # the gradients' norm where clipping computed it (the loss check reads it)
        if self.plan.clip_grad_norm > 0:  # on the unscaled gradients (fp16)
            self.scaler.unscale_(self.optimizer)
            self.grad_norm = self.sync.clip_grad_norm(self.plan.clip_grad_norm)
        self.callbacks.synced(self)
        if self.sync.agreed():  # (sync=ft_ddp: not where an island was lost in this step's exchange)
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.sync.caps.grads_set_to_none)
        self.scheduler.step()
        self.sync.after_step(self.step + 1)  # local_sgd, diloco: the weights travel here

    def _end_epoch(self, metrics: dict) -> None:
        if self.done:  # local_sgd, diloco: the same final weights on every rank
            self.sync.finish(self.step)
        evaluated = self.last_eval[0] == self.step  # after this step already (and logged)
        if evaluated or self.schedule.evaluate_at_epoch_end(self.epoch, self.done):
            if not evaluated:
                metrics.update(self.evaluate_now())
            at = (self.step, self.total_steps) if self.cut and self.done else None  # cut: count steps
            shown = {**metrics, **self.last_eval[1]}
            self.log.print(epoch_line(self.epoch, self.plan.epochs, shown, self.task, at))
        self.log.scalars(metrics, self.step)
        self.progress.last.update(metrics)
        self.parts.workers.sample()  # (the DataLoader workers' memory: at each epoch's end, the run's)
        save = self.schedule.checkpoint_at_epoch_end(self.batches_done)  # (one cut short: saved after its step)
        self.progress.epoch += 1
        self.progress.batches_done = 0
        if save:
            self.save_checkpoint()

    # ------------------------------------------------------------ checkpoints
    def load_state_dict(self, shared: dict, own: dict) -> None:
        restore(self.parts, shared, own)

    def save_checkpoint(self) -> Path | None:
        """Every rank calls this at the same step; see ddp_lab.checkpoint for the layout."""
        self.meter.throughput.pause()  # saving is not training: keep it out of img/s
        self.loss_watch.check()  # never save weights a diverged step produced
        shared, own = states(self.parts)  # (sharded weights: each rank its own shards)
        path = self.checkpointer.save(self.step, shared, own)
        if path is not None:
            self.log.print(f"checkpoint {path.name} ({self._position()})")
        self.meter.throughput.resume()
        self.saved_step, self.saved_path = self.step, path
        return path

    def save_and_stop(self) -> None:
        """At the step agreed after a signal: save (unless this step's is written) and exit 128 + the signal."""
        path = self.saved_path if self.saved_step == self.step else self.save_checkpoint()
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

    def evaluate_now(self) -> dict:
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
        self.progress.last.update({**metrics, f"{split}_correct": int(correct), f"{split}_total": int(total)})
        return metrics

    # ------------------------------------------------------------ the end
    def finish(self) -> dict:
        """summary.json and model.pt (rank 0), the closing line; every rank returns the summary."""
        self.loss_watch.check()
        position.phase("writing results")
        self.parts.workers.sample()
        summary = run_summary(self.parts)
        headline = summary_name(self.task.headline)
        self.log.hparams(self.parts.config_record, self.env.world_size, summary["backend"],
                         {k: summary[k] for k in (headline, "train_loss", "samples_per_sec")})
        self.log.scalars(memory_scalars(summary), self.step)  # every rank's model state and peak memory
        write_results(self.run_dir, self.sync.state_layout(self.model), self.sync.each_weight(self.model), summary,
                      self.env.is_main, config_of(self.model),  # (a transformers model's: hf/ too)
                      self.parts.info.hf_max_shard_mb)
        self.log.print(final_line(summary, headline))
        return summary

    def close(self) -> None:
        self.profiler.close()
        self.log.close()
        if self.sync is not None:
            self.sync.close()  # (torchft's Manager and its servers)
        self.sync = self.forward = None  # DDP's Python comm hook before the process group: else aborts at exit
