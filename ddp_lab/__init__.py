"""ddp_lab: learn, measure and run data-parallel training in PyTorch.

The core, what a training run needs (`torchrun -m ddp_lab.train`):
  config/       the keys, their defaults and checks, the presets, the one-line errors
  training/     the Trainer and what it drives: data, task, optimizer, evaluation, fast path
  distributed/  the process group and the rendezvous of a launch
  sync/         how the replicas agree: DDP, flat buckets, PowerSGD; local SGD, DiLoCo; ZeRO 1-3, FSDP
  collectives/  hand-written all-reduce, reduce-scatter and all-gather on torch.distributed
  checkpoint/   saving and resuming, bit-identical
  guards/       what keeps a run safe: watchdog and stall, preemption, divergence, the run directory, faults
  telemetry/    what a run measures and reports
  models/, datasets/, tuning/
The tools, which use the core and which the core never imports: tools/ (bench, costmodel,
cluster, baselines, figures), each run by its own module name, e.g.
`python -m ddp_lab.tools.bench.scaling`, or by a command of pyproject.toml's [project.scripts]
(`ddp-lab-cluster`, `ddp-lab-costmodel`, ...).
"""
