"""How a rank leaves: its process group ended before the interpreter's exit, whatever ended the run.

gloo's threads still running when the interpreter shuts down end the process with "terminate called without an
active exception" (SIGABRT), after a run that succeeded. So teardown collects what holds the group (a DDP model in
reference cycles, torch's DTensor caches of an fsdp mesh) before destroying it, and the entry point's last call
(exit_finished, exit_failed) makes sure no gloo thread is left, else leaves without the shutdown. A failed rank's
traceback holds the trainer, and with it the group: clear_frames lets it go first.
"""
from __future__ import annotations

import atexit
import gc
import glob
import importlib
import logging
import os
import sys
import traceback
from typing import NoReturn

import torch.distributed as dist


def teardown(keep_for_next_job: bool = False) -> None:
    """Destroy the process group if there is one; safe to call on any exit path.

    keep_for_next_job: a Hydra sweep (-m) runs its jobs one after another in
    the same processes. Destroying and re-creating the group between them would
    reuse the first group's keys in torchrun's store, where the old peer
    addresses still stand, and ranks could connect to ports long closed. So a
    sweep keeps one group for all its jobs, destroyed when the process exits.
    """
    if keep_for_next_job:
        atexit.register(_destroy)  # registering twice is harmless: _destroy checks
        gc.collect()  # this job's model, in reference cycles, gone before the next job builds its own
        return
    _destroy()


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        # A run's DDP model sits in reference cycles (a Trainer's callbacks hold its sync) that hold the
        # group, and torch's DTensor caches hold fsdp's mesh: both let go first, so that
        # destroy_process_group really ends it (else gloo's threads ran on into the interpreter's exit)
        _empty_dtensor_caches()
        gc.collect()
        dist.destroy_process_group()


# torch's caches that keep each device mesh a DTensor used (sharding rules, redistribution plans, the
# mesh's topology), as (module, what empties it); one this torch lacks is passed over (exit_finished
# then still leaves safely)
DTENSOR_CACHES = (("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
                  ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
                  ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
                  ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"))


def _empty_dtensor_caches() -> None:
    if "torch.distributed.tensor" not in sys.modules:  # (no DTensor made: nothing cached)
        return
    for module, path in DTENSOR_CACHES:
        try:
            empty = importlib.import_module(module)
            for name in path.split("."):
                empty = getattr(empty, name)
        except (ImportError, AttributeError):
            continue
        empty()


# What torch and gloo name the threads of a gloo process group (ProcessGroupGloo's workers, its
# transport's event loop), as Linux lists them under /proc/self/task.
GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def gloo_threads_left() -> list[str]:
    """The gloo threads this process still runs ([] where /proc/self/task is not there)."""
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path) as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    return sorted(n for n in names if n in GLOO_THREADS)


def exit_finished() -> None:
    """The last call of a rank whose run finished: destroy the group (a sweep's too), then exit 0.

    Where gloo's threads still outlive destroy_process_group (something holding the group: a
    cache of another torch's than the ones _destroy empties), the group would end only as the
    interpreter shuts down, the order torch warns against (a finished rank aborted with
    "terminate called without an active exception"): such a rank runs its atexit handlers and
    leaves without that shutdown.
    """
    _destroy()
    if gloo_threads_left():
        _exit_now(0)


def clear_frames(exc: BaseException | None) -> None:
    """Drop the locals of the finished frames `exc` (and what it was raised from or during) passed through.

    A failed run's traceback holds Trainer.fit's `self`, and with it the group, until the interpreter's
    shutdown; cleared, the trainer is garbage before teardown, as a finished run's is."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # (frames still running are skipped)
        exc = exc.__cause__ or exc.__context__


def exit_failed(exc: BaseException) -> None:
    """The last call of a rank whose run raised `exc` (an error, sys.exit, a signal's exit), as exit_finished;
    it returns where the caller may re-raise `exc` to the interpreter.

    Where gloo's threads still run (as in exit_finished), the rank leaves as the interpreter would (the
    traceback printed, its atexit handlers run, exit 1; SystemExit's own code), without its shutdown.
    """
    _destroy()
    if not gloo_threads_left():
        return
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        _exit_now(code or 0)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    _exit_now(130 if isinstance(exc, KeyboardInterrupt) else 1)


def _exit_now(code: int) -> NoReturn:
    logging.getLogger("ddp_lab").debug("gloo threads %s outlived destroy_process_group: exit %d without "
                                       "the interpreter's shutdown", gloo_threads_left(), code)
    atexit._run_exitfuncs()  # what the interpreter runs before its shutdown (logging's shutdown among them)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
