"""ddp_lab/distributed/leaving.py: a rank leaves with its group ended, whether its run finished or failed."""
import ast
import gc
import os
import subprocess
import sys
import weakref

import pytest

from ddp_lab import distributed
from tests.conftest import free_port

# A fresh interpreter (the test harness preloads torch._dynamo): join a world of one as a rank does,
# import torch._dynamo as a run's first model check does, train a step, drop the model, leave as
# train.py does, saying which gloo threads are left and whether exit_finished returned.
_LEAVE_AND_LIST_THREADS = """
import gc, os, sys
gc.disable()  # no collection by chance between the step and teardown (a run's is by chance)
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
from ddp_lab import distributed
distributed.setup("gloo", "cpu", 60)
import torch
import torch._dynamo

def a_step(kind):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
    model(torch.ones(2, 4)).sum().backward()
    held = [model]
    held.append(held)  # a reference cycle, as a Trainer's callbacks and its sync make
    if sys.argv[3] == "raises":  # its traceback holds the model, as Trainer.fit's frame holds the trainer
        raise RuntimeError("the step failed")

if sys.argv[3] == "raises":  # train.py's failure path: the entry point's finally, then its last call
    import atexit
    atexit.register(lambda: print("at the interpreter's exit:", distributed.gloo_threads_left(), flush=True))
    try:
        a_step(sys.argv[2])
    except BaseException as e:
        distributed.clear_frames(e)
        distributed.teardown()
        distributed.exit_failed(e)
        raise
a_step(sys.argv[2])  # the model is garbage from here, but for the cycle
distributed.teardown()
print(distributed.gloo_threads_left(), flush=True)
distributed.exit_finished()
print("exit_finished returned", flush=True)
"""


@pytest.mark.system  # a fresh interpreter importing torch._dynamo: 6 s each
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("model", ["linear", "ddp", "fsdp"])
def test_a_finished_rank_leaves_no_gloo_thread_to_the_interpreters_exit(model):
    """Finished ranks aborted at exit (SIGABRT, "terminate called without an active exception")
    where gloo's threads ran on into the interpreter's shutdown: kept alive by torch._dynamo
    imported after the group, by a reference cycle holding the DDP model, by torch's DTensor caches and
    torch.distributed.nn.functional's default arguments (fsdp)."""
    proc = subprocess.run([sys.executable, "-c", _LEAVE_AND_LIST_THREADS, str(free_port()), model, "finishes"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    # teardown itself ends the group (fsdp's too, its caches emptied): exit_finished has nothing left to do
    assert ast.literal_eval(lines[0]) == [] and lines[1:] == ["exit_finished returned"], lines


def test_a_rank_left_without_the_interpreters_shutdown_still_runs_its_atexit_handlers():
    """The way out where gloo's threads outlive teardown (a torch whose caches _destroy does not know):
    the handlers a user registered run, the code is kept."""
    code = ("import atexit; from ddp_lab.distributed import leaving; "
            "atexit.register(lambda: print('handler ran', flush=True)); leaving._exit_now(3)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (3, "handler ran\n"), proc.stderr[-2000:]


@pytest.mark.system
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
@pytest.mark.parametrize("model", ["ddp", "fsdp"])
def test_a_failed_rank_leaves_no_gloo_thread_to_the_interpreters_exit_and_says_why(model):
    """A failed rank's traceback held its model, and the group, into the interpreter's shutdown (ddp: the
    three gloo threads there without clear_frames); it still prints the traceback and exits 1."""
    proc = subprocess.run([sys.executable, "-c", _LEAVE_AND_LIST_THREADS, str(free_port()), model, "raises"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.rstrip().endswith("RuntimeError: the step failed"), proc.stderr[-2000:]
    assert ", in a_step" in proc.stderr  # the traceback as the interpreter (and torch's hook) prints it
    assert proc.stdout.strip() == "at the interpreter's exit: []", proc.stdout  # the group ended before it



def test_a_sweeps_job_leaves_its_model_collected_for_the_next():
    """A sweep keeps its group between jobs; what the job left in reference cycles (its trainer, its model) is
    collected at its end, not overlapping the next job's build (a 6-job sweep's peak rose by one model at a
    random job before)."""
    class Job:
        pass
    job = Job()
    job.itself = job
    gone = weakref.ref(job)
    del job
    gc.disable()
    try:
        distributed.teardown(keep_for_next_job=True)
        assert gone() is None
    finally:
        gc.enable()
