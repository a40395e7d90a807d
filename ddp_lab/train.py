"""Train a model data-parallel: the ddp_lab entry point.

    # one process, no torchrun
    python -m ddp_lab.train
    # 2 processes on this machine (gloo on CPU, NCCL with one GPU per rank)
    torchrun --standalone --nproc_per_node=2 -m ddp_lab.train
    # Hydra overrides
    torchrun --standalone --nproc_per_node=4 -m ddp_lab.train model=resnet18 optim.lr=0.1
    # a sweep: one run directory per job, shared by that job's ranks
    torchrun --standalone --nproc_per_node=2 -m ddp_lab.train -m seed=1,2

Every rank runs this file. Output goes to outputs/<run id>/ (see ddp_lab.config).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_lab import config, distributed, rendezvous, schema, tuning
from ddp_lab.config import ConfigError, RunFailed, say
from ddp_lab.guards import stall
from ddp_lab.trainer import Trainer

log = logging.getLogger("ddp_lab")
schema.register()


def quiet_other_ranks(rank: int) -> None:
    """Only rank 0 talks on the console; every rank still logs to its own rank<N>.log."""
    if rank == 0:
        return
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            h.setLevel(logging.WARNING)


class Terminated(SystemExit):
    """Raised by the SIGTERM handler; exits with status 143 (128 + SIGTERM)."""


def stop_on_sigterm(run_dir: Path) -> None:
    """torchrun sends SIGTERM to every worker when one of them fails (SIGKILL
    follows 30 s later), and so do SLURM and Kubernetes before killing a job.
    Stop at once rather than finish the step: raise, so the `finally` below
    closes the logs and the process group; nothing is saved (the newest
    checkpoint is the resume point). A rank blocked inside a collective sees
    the exception only once the collective returns, which it does when a peer
    dies or after dist.timeout_s. First it writes every thread's Python stack
    to <run dir>/stacks/rank<N>.txt: where a stuck rank was stuck.
    """
    def handler(signum, frame):
        signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM kills outright
        rank = int(os.environ.get("RANK", "0"))
        stacks = stall.dump_stacks(run_dir, rank)
        stall.report_stop(rank, "SIGTERM (torchrun stops every rank when one fails)"
                          + (f"; stacks in {stacks}" if stacks else ""), None)
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)


# @record under @hydra.main: Hydra turns a task's exception into a printed line and
# exit(1), so only here does torchrun's error file get the real traceback.
@hydra.main(version_base="1.3", config_path=config.CONFIG_PATH, config_name="train")
@record
def main(cfg) -> dict:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    env = trainer = inspector = None
    stop_on_sigterm(run_dir)
    try:
        schema.check(cfg)  # every value in its range, before any rank waits for another
        d = cfg.dist  # machine tuning only where asked for (ddp_lab.tuning)
        env = (tuning.start(d, cfg.sync.poll) if tuning.asked(d, cfg.sync.poll)
               else distributed.setup(d.backend, d.device, d.timeout_s))
        quiet_other_ranks(env.rank)
        stall.log_fatal_signals()
        if env.distributed and rendezvous.attempt_store() is not None and cfg.dist.stall_warn_s > 0:
            inspector = stall.StallInspector(rendezvous.attempt_store(), env.rank,
                                             env.world_size, run_dir, cfg.dist.stall_warn_s,
                                             cfg.dist.timeout_s).start()
        log.info("rank %d/%d on %s (%s, %s comm threads), run dir %s", env.rank, env.world_size,
                 env.device, env.backend, env.comm_threads, run_dir)
        trainer = Trainer(cfg, env, run_dir)
        summary = trainer.fit()
        if env.is_main:
            print(f"TensorBoard logs: {run_dir / 'tb'}  (open with: tensorboard --logdir {run_dir.parent})")
        return summary
    except (ConfigError, RunFailed) as e:
        # A bad input (exit 2) or a run that cannot go on (exit 1): one clear line on
        # stderr and in the rank's log, on every rank, and no traceback.
        log.error("%s", e)
        say(f"ddp_lab: error: {e}")
        sys.exit(2 if isinstance(e, ConfigError) else 1)
    except Exception as e:  # anything else: say where and why in one line, then the traceback
        stall.report_stop(env.rank if env else 0, f"{type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}", inspector)
        raise
    finally:
        if inspector is not None:
            inspector.close()
        if trainer is not None:
            trainer.close()
        distributed.teardown(keep_for_next_job=HydraConfig.get().mode == RunMode.MULTIRUN)


if __name__ == "__main__":
    main()
