"""The builder: the config describes, each part builds itself from its own group, the Trainer runs the parts.

`validate(cfg)` is the config's one check at start-up, before any rank waits for another: every key in
its range (config.schema), each group's own rules (the sync family's, sync.validate), then the few
rules that tie two groups together, each with its one-line error. A rule that needs what was built
(the data's task, the world size, the model's size) is said by the part that builds it.

`build(cfg, env, run_dir, preemption)` turns the config into Parts, in the order each needs the last:

    precision  trainer.amp                     -> the autocast dtype, on this device
    work       data (+ model, trainer.loss)    -> datasets, the task, each rank's loaders (training/workload.py)
    plan       trainer (+ the loaders)         -> steps per epoch, total steps, the schedule (when to
                                                  log, evaluate, save: training/schedule.py)
    model      model (+ seed)                  -> the same initial weights on every rank (models/build.py;
                                                  on the meta device where the sync shards them: meta_init.py)
    memory     model x optim x sync x batch    -> refused before any step if it cannot fit (fit_check.py)
    meter      the model, once                 -> FLOPs per sample, the machine's matmul peak
    checkpointing  trainer.activation_checkpointing -> units that recompute their forward in the backward
    sync       sync (+ the model)              -> how the replicas agree (sync/)
    optimizer  optim (+ the sync's parameters) -> the optimizer, its schedule, the grad scaler
    guards, telemetry, checkpointer, and the step callbacks (training/callbacks.py)
    faults     DDP_LAB_FAULT on this rank      -> a NaN loss or a skipped gradient sync, built into the
                                                  loss and the sync (guards/faults.py); the rest observes

Nothing here runs a step: the Trainer (training/trainer.py) resumes and runs what this returns, and never
sees the config: what it reads is in the parts, as plain values (Plan, RunInfo).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf

from ddp_lab import sync as sync_strategies
from ddp_lab.checkpoint import Checkpointer, config_subset
from ddp_lab.checkpoint.pretrained import PretrainedWeights, load_whole
from ddp_lab.config import ConfigError, schema
from ddp_lab.distributed import DistEnv, host_malloc
from ddp_lab.guards.divergence import LossWatch
from ddp_lab.guards.faults import Fault
from ddp_lab.guards.preemption import Preemption
from ddp_lab.models import build_model, check_sync_bn, model_name
from ddp_lab.models.meta_init import (
    MetaInit,
    advice,
    build_on_meta,
    built_a_unit_at_a_time,
    is_transformers,
    refuse_unbuildable,
    reinitialise_whole,
)
from ddp_lab.sync import ReplicaSync, SyncContext, build_sync
from ddp_lab.sync.islands.replica_group import data_part, fault_tolerant, island_identity
from ddp_lab.sync.periodic import PeriodicOptions
from ddp_lab.sync.sharded.grad_scaler import ShardedGradScaler
from ddp_lab.telemetry import position
from ddp_lab.telemetry.meter import Meter, flops_and_peak
from ddp_lab.telemetry.metrics import memory_now_mb, peak_memory_mb
from ddp_lab.telemetry.profiling import StepProfiler
from ddp_lab.telemetry.step_measure import StepMeasure
from ddp_lab.telemetry.stragglers import StepTimer
from ddp_lab.telemetry.target import TimeToTarget
from ddp_lab.telemetry.worker_memory import WorkerMemory
from ddp_lab.training import activation_checkpointing
from ddp_lab.training import callbacks as cb
from ddp_lab.training.fast_path import amp_reason, autocast, resolve_amp, resolve_compile
from ddp_lab.training.fit_check import check_fits_memory
from ddp_lab.training.memory_estimate import Estimate
from ddp_lab.training.optim import build_optimizer, build_schedule, no_decay_names, refuse_whole_tensor_optimizers
from ddp_lab.training.schedule import Schedule
from ddp_lab.training.workload import Workload, build_workload

log = logging.getLogger("ddp_lab")


# ------------------------------------------------------------ the config's one check
def evaluations_fall_on_synchronisations(cfg) -> None:
    """trainer x sync: an evaluation scores weights every rank holds, which local_sgd and diloco
    have only at their synchronisations."""
    every, s = cfg.trainer.eval_every_steps, sync_strategies.options_of(cfg.sync)
    if isinstance(s, PeriodicOptions) and every % s.every:
        raise ConfigError(f"trainer.eval_every_steps={every} must be a multiple of sync.every={s.every} "
                          f"with sync={sync_strategies.name_of(s)}: an evaluation scores weights every rank holds")


def compiled_only_where_it_may(cfg) -> None:
    """trainer x sync: a strategy whose hooks need the eager model (Capabilities.eager) is not compiled."""
    if str(cfg.trainer.compile).lower() != "true":
        return
    why = sync_strategies.eager_only(sync_strategies.options_of(cfg.sync))
    if why:
        raise ConfigError(f"trainer.compile=true cannot run where {why}: set trainer.compile=false (or auto)")


RULES = (evaluations_fall_on_synchronisations, compiled_only_where_it_may)


def validate(cfg) -> None:
    """Raise ConfigError, naming the keys and the fix, at the first value or pair of values that cannot run."""
    schema.check(cfg)
    sync_strategies.check(sync_strategies.options_of(cfg.sync))
    for rule in RULES:
        rule(cfg)


# ------------------------------------------------------------ the parts
@dataclass
class Plan:
    """What the loop runs: how many optimizer steps (per epoch: whole steps of trainer.grad_accum
    micro-batches; in all), what a step does besides the gradient, and when the run logs, evaluates
    and saves (the schedule)."""
    steps_per_epoch: int
    total_steps: int
    cut: bool  # trainer.max_steps ends the run before its epochs do
    grad_accum: int
    step_samples: int  # a rank's samples in a whole step
    schedule: Schedule  # trainer.epochs and the cadences (training/schedule.py)
    clip_grad_norm: float = 0.0  # optim.clip_grad_norm (0: none)
    progress_bar: bool = False  # trainer.progress: on rank 0, when attached to a terminal

    @property
    def epochs(self) -> int:
        return self.schedule.epochs

    @staticmethod
    def of(t, optim, train_loader) -> Plan:
        per_epoch = len(train_loader) // t.grad_accum
        total = per_epoch * t.epochs
        steps = min(total, t.max_steps) if t.max_steps > 0 else total
        return Plan(per_epoch, steps, steps < total, t.grad_accum, t.grad_accum * train_loader.batch_size,
                    Schedule.of(t, len(train_loader)), optim.clip_grad_norm, t.progress)


@dataclass(frozen=True)
class RunInfo:
    """What summary.json and a checkpoint record of the config, as plain values."""
    model: str  # the model's label (models.model_name)
    data: str  # the dataset's callable's name
    global_batch: int  # data.batch_size
    seed: int
    straggler_threshold: float  # trainer.straggler_threshold
    lr_schedule: str  # optim.schedule
    hf_max_shard_mb: int  # model.max_shard_mb (a transformers model's): how its hf/ directory is written

    @staticmethod
    def of(cfg) -> RunInfo:
        return RunInfo(model_name(cfg.model), str(cfg.data["_target_"]).rsplit(".", 1)[-1], cfg.data.batch_size,
                       cfg.seed, cfg.trainer.straggler_threshold, str(cfg.optim.schedule),
                       int(cfg.model.get("max_shard_mb", 50_000)))


@dataclass
class Progress:
    """Where the run is, and what it has measured so far: the Trainer's own state, checkpointed."""
    total_steps: int
    world_size: int
    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # of the current epoch
    last: dict = field(default_factory=dict)  # the newest metrics, for summary.json
    world_sizes: list = field(default_factory=list)  # [step, ranks] at every change

    def __post_init__(self):
        self.world_sizes = self.world_sizes or [[0, self.world_size]]

    def state_dict(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batches_done": self.batches_done,
                "total_steps": self.total_steps, "last": dict(self.last), "world_sizes": self.world_sizes}

    def load_state_dict(self, shared: dict) -> None:
        self.step, self.epoch, self.batches_done = shared["step"], shared["epoch"], shared["batches_done"]
        self.last = dict(shared["last"])
        self.world_sizes = [list(w) for w in shared.get("world_sizes", [[0, shared["world_size"]]])]
        if self.world_sizes[-1][1] != self.world_size:
            self.world_sizes.append([self.step, self.world_size])


@dataclass
class Parts:
    """What a Trainer runs, each built from its own config group (see the module docstring)."""
    info: RunInfo
    config_record: dict  # the whole config as plain values, for TensorBoard's text and HParams
    env: DistEnv
    run_dir: Path
    amp: str
    autocast: object  # a context for the forward pass
    work: Workload
    plan: Plan
    progress: Progress
    loss: Callable  # the training loss of (outputs, targets): the task's (a fault's NaN, on its rank)
    model: torch.nn.Module
    compiled: bool
    meter: Meter
    sync: ReplicaSync
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler
    loss_watch: LossWatch
    target: TimeToTarget
    profiler: StepProfiler
    measure: StepMeasure
    checkpointer: Checkpointer
    preemption: Preemption
    callbacks: cb.Callbacks
    memory: Estimate | None = None  # the memory estimate (CPU runs), its predicted peak beside the measured one
    built_mb: tuple[float, float] = (0.0, 0.0)  # this rank's memory before the model's build, its peak once built
    # its DataLoader workers' memory, sampled at each epoch's end and the run's
    workers: WorkerMemory = field(default_factory=lambda: WorkerMemory(list))


def build_model_for(cfg, caps, env: DistEnv) -> tuple[torch.nn.Module, MetaInit | None]:
    """(the model, None), or, where the sync shards the weights (zero stage 3, fsdp), the model on the
    meta device and its MetaInit: the sync makes it a unit at a time, no rank holding it whole
    (models/meta_init.py). A model whose initialisation cannot be replayed so is built whole, and says why."""
    if caps.sharding < 3 or not env.distributed:
        return _built_whole(cfg, env), None
    if env.device.type != "cpu":  # (the replay draws from the CPU's generator, the build from the device's)
        if env.is_main:
            log.info("model built whole on every rank: on %s ranks the meta-device build is not made (it replays "
                     "the CPU generator's draws); CPU ranks build it a unit at a time", env.device.type)
        return _built_whole(cfg, env), None
    model, why = build_on_meta(lambda: build_model(cfg.model))
    refuse_unbuildable(model, why)
    if not why:
        if env.is_main:
            log.info(built_a_unit_at_a_time(model))
        host_malloc.for_sharded(env.device)  # (before the scratch copies MetaInit makes and frees, a layer each)
        init = MetaInit(model)
        if cfg.model.get("pretrained"):  # (read a unit at a time, as each is made)
            init.load_from(PretrainedWeights(cfg.model.pretrained))
            if env.is_main:
                log.info("pretrained weights: %s, copied into each unit as it is made, each rank reading the part "
                         "it keeps", cfg.model.pretrained)
        return model, init
    if env.is_main:
        log.warning(advice(model, why))
    torch.manual_seed(cfg.seed)
    return _built_whole(cfg, env), None


def _built_whole(cfg, env: DistEnv) -> torch.nn.Module:
    """The model built whole; a transformers model re-initialised as its meta-device build would be, so that
    every sync mode starts it alike (models/meta_init.py); then its pretrained weights (model.pretrained)."""
    model = build_model(cfg.model)
    if is_transformers(model):
        reinitialise_whole(model, cfg.seed)
    if cfg.model.get("pretrained"):
        n = load_whole(model, cfg.model.pretrained)
        if env.is_main:
            log.info("pretrained weights: %d tensors from %s", n, cfg.model.pretrained)
    return model


def build(cfg, env: DistEnv, run_dir: Path, preemption: Preemption | None = None) -> Parts:
    """Every part of a run, built from its own group (validate(cfg) has run, or runs here)."""
    validate(cfg)
    t, run_dir = cfg.trainer, Path(run_dir)
    preemption = preemption or Preemption(env.rank, t.preempt_save_s)  # not installed: never asks to save
    if t.threads > 0:  # (0: keep torch's, torchrun's 1)
        torch.set_num_threads(t.threads)
    host_malloc.choose(str(t.host_malloc))  # before the data and the model take their memory
    amp = resolve_amp(t.amp, env.device)
    log.info(amp_reason(t.amp, amp, env.device))
    position.phase("loading data")  # every stretch of a rank's life is named (telemetry/position.py)
    opts = sync_strategies.options_of(cfg.sync)  # the chosen strategy's keys (sync/registry.py)
    work = build_workload(cfg.data, env, cfg.seed, model=cfg.model, loss=t.get("loss"), grad_accum=t.grad_accum,
                          channels_last=t.channels_last, part=data_part(opts, env))
    plan = Plan.of(t, cfg.optim, work.train_loader)
    progress = Progress(plan.total_steps, env.world_size)
    every_step = sync_strategies.every_step_options(opts)  # (islands: the strategy inside)
    caps = sync_strategies.capabilities(opts, env.device)  # (the strategy's, before it is built)
    # stage 3 and fsdp gather bf16 weights under trainer.amp=bf16 (sync.param_dtype=amp)
    gathered = torch.bfloat16 if (amp == "bf16" and env.distributed and caps.sharding == 3
                                  and every_step.param_dtype == "amp") else None
    compiled, why = resolve_compile(t.compile, env.device, plan.total_steps * plan.step_samples,
                                    caps.eager)
    log.info(why)
    memory = check_fits_memory(cfg.model, cfg.optim, env, work.input_example, work.target_example, work.task,
                               work.train_loader.batch_size, stage=caps.sharding,
                               refuse=t.get("memory_check", True),  # a CPU run: refused if it cannot fit
                               sync=opts if env.distributed else None,
                               checkpointing=t.activation_checkpointing,
                               autocast=torch.bfloat16 if amp == "bf16" else None, gathered=gathered,
                               freed_kept=host_malloc.keeps_freed_gathers(t.host_malloc, env.device),
                               compiled=compiled, workers=work.loader_workers, copied=work.loader_copies)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    position.phase("building the model")
    before_build = memory_now_mb(env.device)
    memory_format = torch.channels_last if work.channels_last else torch.contiguous_format
    model, init = build_model_for(cfg, caps, env)
    model = model.to(memory_format=memory_format) if init else model.to(env.device, memory_format=memory_format)
    check_sync_bn(model, env.distributed, env.device)
    # the FLOP count runs the model once: before the sync's hooks (zero stage 3 would gather for it)
    meter = Meter(env, t.warmup_steps, *flops_and_peak(model, work.input_example, amp, env),
                  full_step_images=plan.step_samples, task=work.task, targets_per_sample=work.targets_per_sample)
    # DDP wraps the compiled model: compiling DDP breaks its forward's graph (and slowed CPU LeNet)
    checkpointed = activation_checkpointing.apply(model, t.activation_checkpointing, every_step.shard_units,
                                                  every_step.unit_mb)
    if checkpointed:
        log.info("activation checkpointing: %d module(s) recompute their forward in the backward (%s, ...)",
                 len(checkpointed), type(checkpointed[0]).__name__)
    no_decay = no_decay_names(model, cfg.optim.get("no_decay", "none"))
    identity = island_identity(config_subset(cfg), model) if fault_tolerant(opts) else ""  # (torchft islands alike)
    ctx = SyncContext(init, no_decay, gathered, identity=identity)
    sync = build_sync(opts, torch.compile(model) if compiled else model, env, ctx)
    refuse_whole_tensor_optimizers(cfg.optim, sync)
    built_mb = (before_build, peak_memory_mb(env.device))  # (made and sharded: zero 3's and fsdp's a unit at a time)
    if env.is_main:  # (every rank's: summary.json)
        log.info("model built: rank 0's peak memory so far %.0f MiB, %.0f before the build%s", *built_mb[::-1],
                 f"; it read {init.read_mb:.1f} MiB of the pretrained safetensors" if init and init.read_mb else "")
    optimizer = build_optimizer(cfg.optim, sync.param_groups(), env.device)  # (zero: this rank's shard)
    scheduler = build_schedule(optimizer, cfg.optim, plan.steps_per_epoch, plan.total_steps)
    # ranks whose weights or gradients differ after the sync compare losses instead
    apart = sync.caps.diverges
    loss_watch = LossWatch(env, opts.every if apart else t.log_every, optimizer.defaults.get("lr", 0.0), amp,
                           None if apart or sync.caps.shards else model.parameters())
    profiler = StepProfiler(t.profile, t.profile_wait, t.profile_active, run_dir, env.rank,
                            env.device.type == "cuda")
    timer = StepTimer(model, env) if t.measure == "full" else None  # stragglers: a hook per parameter
    measure = StepMeasure(t.measure, meter, sync, profiler, timer, (model, optimizer))
    loss, fault = work.task.loss, Fault.on_rank(env.rank)  # DDP_LAB_FAULT, on its rank only
    if fault is not None:  # what changes the step is built into it here; the fault's callback only observes
        loss, sync = fault.nan_loss(loss, progress), fault.skipping_sync(sync, progress)
    callbacks = cb.Callbacks([cb.PositionMarks(), cb.Measure(measure), cb.LossCheck(), cb.LogWhenDue(),
                              cb.EvaluateWhenDue(), cb.CheckpointWhenDue(),
                              *([cb.FaultInjection(fault)] if fault else []), cb.StopWhenAsked(preemption)])
    record = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return Parts(RunInfo.of(cfg), record, env, run_dir, amp, partial(autocast, amp, env.device), work, plan,
                 progress, loss, model, compiled, meter, sync, optimizer, scheduler,
                 # (zero, fsdp: an overflow in any rank's shard skips the step on every rank)
                 (ShardedGradScaler if sync.caps.shards else torch.amp.GradScaler)("cuda", enabled=amp == "fp16"),
                 loss_watch,
                 TimeToTarget(t, work.task.name), profiler, measure, Checkpointer(cfg, env, run_dir), preemption,
                 callbacks, memory, built_mb, WorkerMemory(work.loader_worker_pids))
