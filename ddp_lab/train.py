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

import gc

if __name__ == "__main__":  # importing torch and Hydra makes millions of objects that live for the whole run:
    gc.disable()  # the collector would walk them again and again as they come (~40% of the start-up)

import logging
import os
import sys
from functools import partial
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_lab import config, distributed, tuning
from ddp_lab.config import ConfigError, RunFailed, error_file, renamed, say, schema
from ddp_lab.config.composition import COMPOSITION_ERRORS, composition_error
from ddp_lab.distributed import rendezvous
from ddp_lab.guards import stall
from ddp_lab.guards.preemption import Preemption, Terminated
from ddp_lab.guards.rundir import LaunchTrace, RunDirTaken
from ddp_lab.guards.watchdog import Watchdog, first_failure, note_failure
from ddp_lab.sync.registry import refuse_foreign_keys
from ddp_lab.training import fast_path
from ddp_lab.training.builder import validate
from ddp_lab.training.trainer import Trainer

log = logging.getLogger("ddp_lab")
schema.register()
if __name__ == "__main__":
    gc.freeze()  # what is imported stays: the collector leaves it alone from here on, the exit too
    gc.enable()


def quiet_other_ranks(rank: int) -> None:
    """Only rank 0 talks on the console; every rank still logs to its own rank<N>.log."""
    if rank == 0:
        return
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            h.setLevel(logging.WARNING)


def _rank_before_setup() -> int:
    """RANK as torchrun set it, for the lines a signal prints before setup checks it."""
    rank = os.environ.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0


# @record under @hydra.main: Hydra turns a task's exception into a printed line and
# exit(1), so only here could torchrun's error file get it. Each branch below writes the
# rank's one line there first (ddp_lab.config.error_file); KeepFirst keeps it.
@hydra.main(version_base="1.3", config_path=config.CONFIG_PATH, config_name="train")
@partial(record, error_handler=error_file.KeepFirst())
def main(cfg) -> dict:
    global composed
    composed = True
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    env = trainer = watchdog = None
    launch, rank = HydraConfig.get(), _rank_before_setup()
    # what Hydra wrote here for this launch, taken back if it is refused
    trace = LaunchTrace(run_dir, rank, launch.output_subdir) if launch.mode == RunMode.RUN else None
    # SIGTERM/SIGINT: finish the step, save, exit 143 (ddp_lab.guards.preemption)
    preemption = Preemption(rank, cfg.trainer.preempt_save_s, run_dir).install()
    try:
        validate(cfg)  # every value in its range, every pair of groups agreeing, before any rank waits
        d = cfg.dist  # machine tuning only where asked for (ddp_lab.tuning)
        env = (tuning.start(d, cfg.sync.poll) if tuning.asked(d, cfg.sync.poll)
               else distributed.setup(d.backend, d.device, d.timeout_s))
        quiet_other_ranks(env.rank)
        preemption.rank = env.rank
        fast_path.own_compile_cache(env.rank)  # no lock shared with another rank
        stall.log_fatal_signals()
        store = rendezvous.attempt_store() if env.distributed else None
        if store is not None:
            preemption.watch(store, env.world_size)
        if store is not None or "TORCHELASTIC_RUN_ID" in os.environ:  # ddp_lab.guards.watchdog
            watchdog = Watchdog(store, env.rank, env.world_size, run_dir, d.stall_warn_s,
                                d.timeout_s).start()
        log.info("rank %d/%d on %s (%s, %s comm threads), run dir %s", env.rank, env.world_size,
                 env.device, env.backend, env.comm_threads, run_dir)
        trainer = Trainer.from_config(cfg, env, run_dir, preemption)
        summary = trainer.fit()
        if env.is_main:
            print(f"TensorBoard logs: {run_dir / 'tb'}  (open with: tensorboard --logdir {run_dir.parent})")
        return summary
    except (ConfigError, RunFailed) as e:
        # A bad input (exit 2) or a run that cannot go on (exit 1): one clear line on
        # stderr and in the rank's log, on every rank, and no traceback.
        log.error("%s", e)
        say(f"ddp_lab: error: {e}")
        error_file.write(f"ddp_lab: error: {e}")  # torchrun's root cause: this line
        if isinstance(e, RunDirTaken) and trace is not None:
            trace.take_back()  # a refused launch leaves the directory it protects as it was
        sys.exit(2 if isinstance(e, ConfigError) else 1)
    except Terminated as e:  # SIGTERM/SIGINT: torchrun reports a rank's 143 as a failure too
        by = preemption.proposer or preemption.signal
        error_file.write(f"ddp_lab: rank {preemption.rank} stopped on {by}: exit {e.code}; "
                         "continue with trainer.resume=auto")
        raise
    except Exception as e:  # anything else: say where and why in one line, then the traceback
        rank = env.rank if env else _rank_before_setup()
        stall.log_to_file(f"rank {rank}: {type(e).__name__}: {e}", sys.exc_info())  # all of gloo's text
        store = rendezvous.attempt_store()
        first = first_failure(store)
        cause = stall.short_cause(e)
        if first is not None:  # a rank stopped first: this rank's error (a closed connection) follows from it
            cause = f"{type(e).__name__} after another rank stopped first: {first}"
        line = stall.report_stop(rank, cause, watchdog, name_lost=first is None)
        if first is None:
            note_failure(store, line)
        raise
    finally:
        preemption.close()
        if watchdog is not None:
            watchdog.close()
        if trainer is not None:
            trainer.close()
        trainer = None  # its model holds the process group (DDP's reducer): released before teardown destroys it
        distributed.clear_frames(sys.exc_info()[1])  # a failure's traceback holds it too (Trainer.fit's self)
        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
        distributed.teardown(keep_for_next_job=multirun)
        if not multirun:  # the interpreter's last collections walk torch's whole heap (~1 s a process): skip them
            gc.freeze()


def refuse_old_and_foreign_keys(argv: list[str]) -> None:
    """Before Hydra composes: a key renamed since an older guide, or a sync key the chosen strategy does not take,
    is one line and exit 2 on every rank (Hydra's own refusal runs to several lines and names no fix)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-") or a.startswith("~")]
    try:
        renamed.refuse_renamed(overrides)
        refuse_foreign_keys(overrides)
    except ConfigError as e:
        say(f"ddp_lab: error: {e}")
        sys.exit(2)


composed = False  # main() was called: Hydra composed the config (an error after that is not the command line's)


def composed_or_refused() -> None:
    """main(), with Hydra's composition errors (a preset not there, a value of the wrong type) as one line and exit 2
    on every rank: Hydra raises them to here when HYDRA_FULL_ERROR is set, which a user's own setting keeps."""
    full = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        main()
    except COMPOSITION_ERRORS as e:
        if full or composed:
            raise
        say(f"ddp_lab: error: {composition_error(e)}")
        sys.exit(2)


if __name__ == "__main__":
    refuse_old_and_foreign_keys(sys.argv[1:])
    try:
        composed_or_refused()
    except BaseException as e:  # sys.exit's too
        distributed.exit_failed(e)
        raise
    distributed.exit_finished()
