"""Run a function in N real processes that share a torch.distributed group.

    from tests.multiproc import run_in_processes

    def _check(rank, world_size, n):        # module level, so it pickles
        t = torch.full((n,), float(rank))
        dist.all_reduce(t)
        return t.tolist()

    results = run_in_processes(_check, 3, 5)   # [rank0's list, rank1's, rank2's]

Each rank is a real process that never shares state with the caller: by
default it is forked from a "forkserver" process that has imported torch,
torch._dynamo and ddp_lab.training.trainer (start_method="forkserver"), which saves
the seconds every rank would spend importing them under start_method="spawn"
(a fresh interpreter, also supported). torch._dynamo is there because a
model's first forward on the meta device (models.check_fits_data) imports it:
2 s per rank on a 2-core machine. Neither start method forks the caller itself, so a caller
that has started threads or initialised CUDA is safe. Each rank joins a
process group (`backend`; NCCL ranks take GPU rank % device_count) through a
FileStore in a fresh temporary directory (no TCP port to pick, so parallel
test runs cannot collide), runs ``fn(rank, world_size, *args)`` and sends its
return value back over a pipe of its own, whole, before it tears its group down
(torch's gloo teardown has aborted a finished rank; that must not lose its
result, nor leave a half-written message on a channel the others share). The
return value must be picklable: plain Python values
or CPU tensors. If any rank raises, its traceback is re-raised here in a
RuntimeError and the other ranks (likely blocked in a collective waiting for
it) are killed; the same happens (TimeoutError) when `timeout` seconds pass.
Nothing is left running either way.

Starting processes is still the slow part, so batch many checks into one call
rather than one call per case.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import time
import traceback
import warnings
from multiprocessing.connection import wait
from typing import Any, Callable

import torch.multiprocessing as mp

__all__ = ["run_in_processes"]


def _entry(rank, world_size, backend, init_method, timeout, fn, args, conn):
    # Imports here, not at module level, keep importing this harness cheap
    # for test collection.
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.enable()  # a rank killed by a signal (an abort in C++) says where it was

    # One intra-op thread per process, as torchrun sets, or N processes
    # fight over the cores. (A forkserver child inherits the server's
    # environment, so set both here.)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        report = (True, fn(rank, world_size, *args))
    except BaseException:  # report everything, including KeyboardInterrupt
        report = (False, traceback.format_exc())
    try:
        conn.send(report)  # pickled first, then written whole: sent before any teardown
    except Exception:  # the value does not pickle
        conn.send((False, traceback.format_exc()))
    conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_in_processes(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120,
    start_method: str = "forkserver",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in `world_size` processes.

    Returns the list of return values, indexed by rank. `fn` and `args` must
    be picklable (fn defined at module level). OMP_NUM_THREADS=1 in every
    rank. `timeout` bounds the whole call and is also the process group's
    timeout. Raises RuntimeError with the
    failing rank's traceback if a rank raises or dies, or TimeoutError if the
    ranks have not all finished after `timeout` seconds; in both cases every
    process still running is killed before raising.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # The server process imports these once; every rank is then forked
        # from it instead of importing them again (seconds per process).
        # Only takes effect if this is the first forkserver use here.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "ddp_lab.training.trainer"])
    procs, conns = [], []
    with tempfile.TemporaryDirectory(prefix="ddp_lab_mp_") as tmp:
        init_method = "file://" + os.path.join(tmp, "store")
        # Children inherit the environment at start(); one intra-op thread
        # per process, as torchrun sets, or N processes fight over the cores.
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            for rank in range(world_size):
                receive, send = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_entry,
                    args=(rank, world_size, backend, init_method, timeout, fn, args, send),
                    daemon=True,
                )
                p.start()
                send.close()  # the rank holds the only writing end: its death reads as EOF
                procs.append(p)
                conns.append(receive)
        except BaseException:  # e.g. fn or args cannot be pickled
            _kill(procs)
            raise
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        try:
            values = _collect(procs, conns, timeout)
        except BaseException:
            # The other ranks are probably blocked in a collective waiting
            # for the one that failed: do not wait for them.
            _kill(procs)
            raise
        finally:
            for c in conns:
                c.close()
        _join_or_kill(procs, grace=10)
        for rank, p in enumerate(procs):
            if p.exitcode != 0:  # its result is in: a crash in teardown, not in the check
                warnings.warn(f"rank {rank} of {world_size} reported its result, then exited "
                              f"with code {p.exitcode} while tearing down", RuntimeWarning, stacklevel=2)
        return values


def _collect(procs, conns, timeout: float) -> list[Any]:
    world_size = len(procs)
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    waiting = {conn: rank for rank, conn in enumerate(conns)}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"ranks {sorted(waiting.values())} of {world_size} did not finish "
                               f"within {timeout:g} s")
        for conn in wait(list(waiting), timeout=left):
            rank = waiting.pop(conn)
            try:
                ok, value = conn.recv()
            except EOFError:  # it died (killed, segfault, os._exit) before its result was whole
                procs[rank].join(timeout=5)
                raise RuntimeError(f"rank {rank} of {world_size} exited with code "
                                   f"{procs[rank].exitcode} without reporting a result") from None
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
            values[rank] = value
    return [values[r] for r in range(world_size)]


def _kill(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)


def _join_or_kill(procs, grace: float) -> None:
    """Let the ranks exit on their own (they destroy their group), then kill stragglers."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    _kill(procs)
