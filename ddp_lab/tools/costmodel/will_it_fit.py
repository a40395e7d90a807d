"""Will it fit? Before a run: each strategy's memory per rank and its price on a link.

    python -m ddp_lab.tools.costmodel.will_it_fit --ranks 4 --memory 2GiB --link 1gbit -- model=gpt2 data=text \
        data.path=corpus.txt optim=adamw

For the model, optimizer and data the overrides after `--` choose (the training's own config:
`model._target_=my.module.build` works as for ddp_lab.train), at --ranks ranks with --memory
each, it prints for DDP and ZeRO stages 1, 2 and 3:

- the model state each rank holds between steps (ZeRO's formulas, fp32: DDP 4 + 4 + K bytes a
  parameter, stage 1 4 + 4 + K/N, stage 2 4 + (4 + K)/N, stage 3 (8 + K)/N, K the optimizer's
  bytes of state), the activations of a rank's batch (ddp_lab.training.memory_estimate, the same
  for every strategy; under trainer.amp=bf16, or auto on a machine that runs bf16, as autocast makes
  them, as the run's own check counts them: the bf16 casts of the weights too, but under stage 3, whose
  weights are gathered in bf16 already), the transient buffers (stage 3: the units gathered and the reduce-scatters
  in flight; below it one more gradient-sized buffer: the same module's transient_bytes), the
  runtime (--runtime: this process's memory once it has loaded the data, about what a rank holds
  before the model), torch.compile's own where the run would compile (trainer.compile, resolved as the run
  resolves it; stage 3 runs eagerly) and whether their sum, the predicted peak, fits in --memory (or the
  peak this process reached loading the data, where that is higher: a rank goes through it too);
- the bytes each sends per step and their time on --link (the alpha-beta model's ring formulas,
  ddp_lab.tools.costmodel.formulas: an all-reduce of the gradients for DDP, stages 1 and 2 its two
  halves, stage 3 the weights gathered twice and the gradients reduce-scattered once), and with
  --compute-ms the step: compute plus communication, none of it overlapped (an upper bound).
  A reduce-scatter is priced as the run's collectives send it: torch's on gloo (sync.algo=builtin
  on CPU) is an all-reduce that keeps one chunk (pytorch#118911), twice a ring's bytes; ours
  (sync.algo=ring_textbook or direct: the same bytes) and NCCL's are a ring's.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from hydra.errors import HydraException

from ddp_lab.config import ConfigError
from ddp_lab.config.composition import composition_error
from ddp_lab.tools.cluster.memory_limit import parse_size
from ddp_lab.tools.cluster.shaping import ClusterError, parse_rate
from ddp_lab.tools.costmodel.formulas import ring, ring_all_gather, ring_reduce_scatter

GiB = 2**30
STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


def model_state_bytes(params: int, state_per_param: int, ranks: int, strategy: str, dtype_bytes: int = 4) -> int:
    """Bytes of weights, gradients and optimizer state a rank holds (state_per_param tensors like a weight)."""
    w, g, s = params * dtype_bytes, params * dtype_bytes, params * dtype_bytes * state_per_param
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, ranks), "zero2": (1, ranks, ranks), "zero3": (ranks,) * 3}[strategy]
    return sum(-(-b // n) for b, n in zip((w, g, s), shard))


def wire_seconds(strategy: str, ranks: int, grad_bytes: int, alpha: float, beta: float, gamma: float,
                 reduce_scatter: str = "ring") -> float:
    """The communication of one step on a link (alpha s a message, beta s a byte, gamma s a byte added);
    reduce_scatter: "ring", or "all-reduce" where the backend runs one in its place (gloo)."""
    if strategy == "ddp":
        return ring(ranks, grad_bytes, alpha, beta, gamma)
    rs = (ring if reduce_scatter == "all-reduce" else ring_reduce_scatter)(ranks, grad_bytes, alpha, beta, gamma)
    gathers = 2 if strategy == "zero3" else 1  # stage 3: for the forward and again for the backward
    return rs + gathers * ring_all_gather(ranks, grad_bytes, alpha, beta, gamma)


def options_at(opts, stage: int):
    """The run's sync options as they would be at ZeRO stage `stage` (0: as they are): zero's, with the run's
    own units (and its own zero keys, where the run is zero)."""
    from ddp_lab.sync.sharded.zero1 import ZeroOptions
    if stage == 0:
        return opts
    if isinstance(opts, ZeroOptions):
        return dataclasses.replace(opts, zero_stage=stage)
    return ZeroOptions(zero_stage=stage, shard_units=opts.shard_units, unit_mb=opts.unit_mb)


def on_cuda(cfg) -> bool:
    """Whether the run's ranks would be GPUs (dist.device, auto: where this machine has one)."""
    import torch
    return cfg.dist.device == "cuda" or (cfg.dist.device == "auto" and torch.cuda.is_available())


def reduce_scatter_of(cfg) -> str:
    """How the run's reduce-scatter travels: "all-reduce" for torch's on gloo, else "ring"."""
    if cfg.sync.algo != "builtin":
        return "ring"  # ours (sync.algo=ring_textbook or direct: a ring's bytes)
    backend = cfg.dist.backend
    if backend == "auto":
        backend = "nccl" if on_cuda(cfg) else "gloo"
    return "all-reduce" if backend == "gloo" else "ring"


def autocast_of(cfg):
    """The dtype the run's forward autocasts to (trainer.amp=bf16, or auto where this machine runs bf16), else
    None: the activations are counted as the run's own check counts them."""
    import torch

    from ddp_lab.training.fast_path import resolve_amp
    amp = resolve_amp(cfg.trainer.amp, torch.device("cuda" if on_cuda(cfg) else "cpu"))
    return torch.bfloat16 if amp == "bf16" else None


def wire_bytes(strategy: str, grad_bytes: int) -> int:
    """Bytes handed to collectives per step, counted as ddp_lab's summary.json counts them (an
    all-reduce's buffer once; a gather or a reduce-scatter as half of one)."""
    return grad_bytes * 3 // 2 if strategy == "zero3" else grad_bytes


def table(params: int, state: int, activations: int | dict, ranks: int, memory: int, link_bits: int | None,
          alpha: float, compute_ms: float | None, reduce_scatter: str = "ring", transient: dict | None = None,
          runtime: int = 0, compiler: dict | None = None, loaded: int = 0, workers: int = 0) -> list[dict]:
    """A row per strategy; activations: the same for every strategy, or by strategy; transient and compiler
    (torch.compile's): their bytes by strategy (none: 0), runtime: the process's own, loaded: its peak loading
    the data, workers: bytes of the DataLoader's processes beside a rank (weighed in what fits, not its peak)."""
    from ddp_lab.training.fit_check import fits  # (the trainer's rule; torch only here)
    rows = []
    for s in STRATEGIES:
        held = model_state_bytes(params, state, ranks, s)
        acts = activations[s] if isinstance(activations, dict) else activations
        ahead = runtime + held + acts + (transient or {}).get(s, 0) + (compiler or {}).get(s, 0)
        row = {"strategy": s, "model_state_bytes": held, "total_bytes": held + acts, "peak_bytes": max(loaded, ahead),
               "fits": fits(max(loaded, ahead + workers), memory), "wire_bytes": wire_bytes(s, 4 * params)}
        if link_bits:
            comm = wire_seconds(s, ranks, 4 * params, alpha, 8 / link_bits, 0.0, reduce_scatter)
            row["comm_ms"] = comm * 1e3
            if compute_ms is not None:
                row["step_ms"] = compute_ms + comm * 1e3
        rows.append(row)
    return rows


def describe(cfg, ranks: int, batch: int | None):
    """(parameters, optimizer state tensors per parameter, its name, activation bytes per rank by strategy,
    samples per rank, transient bytes by strategy, torch.compile's bytes by strategy, the DataLoader worker
    processes a rank runs, the bytes they may copy of their data's Python objects together) of cfg; the model is
    checked against the data first, as the training checks it."""
    import torch

    from ddp_lab.distributed import host_malloc
    from ddp_lab.models import build_model, check_fits_data
    from ddp_lab.sync import options_of
    from ddp_lab.training.data import build_datasets, example, loader_copies, loader_workers
    from ddp_lab.training.memory_estimate import estimate, optimizer_state, transient_bytes
    from ddp_lab.training.tasks import build_loss, choose_task
    from ddp_lab.training.workload import num_classes
    train, test = build_datasets(cfg.data)
    x, y = example(train)
    task = choose_task(cfg.data.task, y, build_loss(cfg.trainer.get("loss")))
    check_fits_data(cfg.model, cfg.data, x, y, task, num_classes(train) if task.correct_name else 0)
    per_rank = batch or max(1, cfg.data.batch_size // ranks)
    opts = options_of(cfg.sync)
    # (under autocast, with the weights in fp32 as stages 0-2 hold them: their bf16 casts saved for the backward)
    autocast, checkpointing = autocast_of(cfg), cfg.trainer.activation_checkpointing
    e = estimate(cfg.model, cfg.optim, x, y, task, per_rank, sync=options_at(opts, 1), checkpointing=checkpointing,
                 autocast=autocast)
    acts = dict.fromkeys(STRATEGIES, e.activation_bytes)
    if autocast is not None and ranks > 1 and options_at(opts, 3).param_dtype == "amp":
        # stage 3 gathers the weights in bf16 (sync.param_dtype=amp): no casts to save, as the run's check counts
        acts["zero3"] = estimate(cfg.model, cfg.optim, x, y, task, per_rank, sync=options_at(opts, 3),
                                 checkpointing=checkpointing, autocast=autocast, gathered=autocast).activation_bytes
    with torch.device("meta"):
        net = build_model(cfg.model)
    kept = host_malloc.keeps_freed_gathers(cfg.trainer.get("host_malloc", "auto"),
                                           torch.device("cuda" if on_cuda(cfg) else "cpu"))
    transient = {s: transient_bytes(net, e.weight_bytes, stage, options_at(opts, stage) if ranks > 1 else None, kept)
                 for s, stage in zip(STRATEGIES, (0, 1, 2, 3))}
    workers = loader_workers(cfg.data, train, test, torch.device("cpu"))  # (the host's memory, where they run)
    return e.parameters, optimizer_state(cfg.optim)[0], e.optimizer, acts, per_rank, transient, \
        compiler_bytes(cfg, ranks, per_rank, len(train)), workers, loader_copies(cfg.data, train, test,
                                                                                 torch.device("cpu"))


def compiler_bytes(cfg, ranks: int, per_rank: int, samples: int) -> dict:
    """torch.compile's bytes by strategy: COMPILE_BYTES where trainer.compile resolves on for this run's samples
    per rank (as the run's Plan counts them), but under stage 3, which runs eagerly."""
    import torch

    from ddp_lab.training.fast_path import resolve_compile
    from ddp_lab.training.memory_estimate import COMPILE_BYTES
    t = cfg.trainer
    steps = max(1, samples // ranks // per_rank) // t.grad_accum * t.epochs
    steps = min(steps, t.max_steps) if t.max_steps > 0 else steps
    compiled, _ = resolve_compile(t.compile, torch.device("cuda" if on_cuda(cfg) else "cpu"),
                                  steps * per_rank * t.grad_accum)
    return {s: COMPILE_BYTES if compiled and s != "zero3" else 0 for s in STRATEGIES}


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from ddp_lab.config import schema
    from ddp_lab.training.builder import validate
    schema.register()  # the schemas the config composes on, as ddp_lab.train registers them
    with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
        try:
            cfg = hydra_compose(config_name="train", overrides=overrides)
        except HydraException as e:  # a preset or key that is not there: one line, not Hydra's traceback
            raise ConfigError(composition_error(e)) from None
    validate(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.costmodel.will_it_fit",
                                description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, required=True, help="the world size")
    p.add_argument("--memory", required=True, help="memory per rank, e.g. 2GiB, 512m")
    p.add_argument("--link", help="a link's rate in tc's units (1gbit, 200mbit): prices each step's communication")
    p.add_argument("--alpha-us", type=float, default=50.0, help="seconds a message costs on the link, in us")
    p.add_argument("--compute-ms", type=float, help="a step's compute, to add to its communication")
    p.add_argument("--batch", type=int, help="samples per rank in a forward (default: data.batch_size / ranks)")
    p.add_argument("--runtime", default="measured", help="a rank's memory before the model, e.g. 700m (default: "
                   "this process's, measured once it has loaded the data; 0 to leave it out)")
    p.add_argument("overrides", nargs="*", help="the training's config overrides (model=gpt2 optim=adamw ...)")
    args = p.parse_args(argv)
    try:
        if args.ranks < 1:
            raise ConfigError(f"--ranks {args.ranks}: give the world size, 1 or more")
        try:
            memory = parse_size(args.memory, "--memory")
            link = parse_rate(args.link) if args.link else None
        except ClusterError as e:
            raise ConfigError(str(e).replace("--rate", "--link")) from None
        runtime = None if args.runtime == "measured" else 0 if args.runtime == "0" else \
            parse_size(args.runtime, "--runtime")
        from ddp_lab.sync.registry import refuse_foreign_keys
        refuse_foreign_keys(args.overrides)  # (a key of another strategy: one line, not Hydra's traceback)
        cfg = compose(args.overrides)
        params, state, name, acts, batch, transient, compiler, workers, copied = describe(cfg, args.ranks, args.batch)
        loaded = 0
        if runtime is None:
            from ddp_lab.training.memory_estimate import peak_runtime_bytes, runtime_bytes
            runtime, loaded = runtime_bytes(), peak_runtime_bytes()
    except ConfigError as e:
        print(f"ddp_lab.tools.costmodel.will_it_fit: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from ddp_lab.training.memory_estimate import WORKER_BYTES
    rs = reduce_scatter_of(cfg)
    rows = table(params, state, acts, args.ranks, memory, link, args.alpha_us * 1e-6, args.compute_ms, rs,
                 transient, runtime, compiler, loaded, workers * WORKER_BYTES + copied)
    under = " under bf16 autocast" if autocast_of(cfg) is not None else ""
    if acts["zero3"] != acts["ddp"]:
        under += f" (stage 3's, its weights gathered in bf16: {acts['zero3'] / GiB:.2f})"
    print(f"model={cfg.model.get('name') or cfg.model['_target_']}: {params:,} parameters; {name} keeps {state} "
          f"tensor(s) a parameter; {args.ranks} ranks, {memory / GiB:.2f} GiB each; activations "
          f"{acts['ddp'] / GiB:.2f} GiB for {batch} sample(s) a rank{under}; runtime {runtime / GiB:.2f} GiB"
          + (f" (loading the data peaked at {loaded / GiB:.2f})" if loaded > runtime else "")
          + (f"; torch.compile {compiler['ddp'] / GiB:.2f} GiB (not under stage 3, eager)" if compiler["ddp"] else "")
          + (f"; {workers} DataLoader worker processes a rank, {(workers * WORKER_BYTES + copied) / GiB:.2f} GiB "
             "beside it" + (f" ({copied / GiB:.2f} of it the copies they may make of the data's Python objects)"
                            if copied >= 2**20 else "") if workers else ""))
    if link:
        print("reduce-scatter priced as " + ("gloo runs torch's: an all-reduce, twice a ring's bytes "
                                            "(sync.algo=ring_textbook sends a ring's)" if rs == "all-reduce"
                                            else "a ring's"))
    link_cols = f"  {'comm ms/step':>12}" + (f"  {'step ms':>9}" if args.compute_ms is not None else "")
    print(f"{'strategy':<9} {'model state GiB':>15} {'+ activations':>13} {'peak GiB':>9}  {'fits':<4} "
          f"{'wire MB/step':>12}" + (link_cols if link else ""))
    for r in rows:
        line = (f"{r['strategy']:<9} {r['model_state_bytes'] / GiB:>15.3f} {r['total_bytes'] / GiB:>13.3f} "
                f"{r['peak_bytes'] / GiB:>9.3f}  {'yes' if r['fits'] else 'no':<4} {r['wire_bytes'] / 1e6:>12.1f}")
        if link:
            line += f"  {r['comm_ms']:>12.1f}" + (f"  {r['step_ms']:>9.1f}" if "step_ms" in r else "")
        print(line)
    fits = [r["strategy"] for r in rows if r["fits"]]
    from ddp_lab.training.fit_check import ESTIMATE_ERROR
    print(f"fits (the peak{', the DataLoader workers' if workers else ''} and {ESTIMATE_ERROR:.0%} more, the "
          "estimate's error, within --memory): "
          f"{', '.join(fits) or 'none'}")
    print("run the first with: " + {
        "ddp": "sync=ddp (or flat)", "zero1": "sync=zero", "zero2": "sync=zero sync.zero_stage=2",
        "zero3": "sync=zero sync.zero_stage=3"}[fits[0]] if fits else
          "none fits: fewer samples a rank (--batch), more ranks, or more memory")


if __name__ == "__main__":
    main()
