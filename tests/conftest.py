"""Shared fixtures: a tiny Fashion-MNIST on disk, Hydra's compose API, a torchrun runner."""
from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from ddp_lab import config  # noqa: F401  (registers the resolvers and the schema)
from ddp_lab.config import schema
from ddp_lab.distributed import DistEnv
from ddp_lab.training.trainer import Trainer

schema.register()

# Tests that build network namespaces or a SLURM cluster through these fixtures are
# system tests (make test-all), as the ones that launch torchrun are marked by hand.
SYSTEM_FIXTURES = {"cluster_name", "two_hosts", "slurm"}


def guide_reference(command: str) -> str:
    """What docs/configuration.md holds between the markers of `python -m <command>`'s reference."""
    guide = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    begin, end = f"<!-- reference: python -m {command} -->\n", "<!-- end of reference -->"
    assert begin in guide, f"docs/configuration.md lacks the markers of `python -m {command}`"
    return guide.split(begin, 1)[1].split(end, 1)[0]


# The slow tier (make test-all; make test leaves it out): the multi-process proofs, each module a launch of
# real ranks per case or more (the dp=N == dp=1 matrix, resumes, watchdogs, the tools' command lines).
SLOW_MODULES = {
    "checkpoint/test_across_modes.py", "checkpoint/test_compat.py", "checkpoint/test_files.py",
    "checkpoint/test_reshard.py",
    "checkpoint/test_sharded.py", "collectives/test_allreduce.py", "collectives/test_quantized.py",
    "collectives/test_reduce_scatter_all_gather.py",
    "config/test_bad_inputs.py", "distributed/test_distributed.py", "distributed/test_rendezvous.py",
    "guards/test_divergence.py", "guards/test_faults.py", "guards/test_preemption.py", "guards/test_stall.py",
    "guards/test_watchdog.py", "models/test_hf_training.py", "models/test_meta_init.py", "sync/test_diloco.py",
    "sync/test_equal_to_one_process.py",
    "sync/test_fsdp.py", "sync/test_grad_scaler.py", "sync/test_islands.py", "sync/test_lifetime.py",
    "sync/test_periodic.py", "sync/test_powersgd.py", "sync/test_registry.py", "sync/test_units.py",
    "sync/test_user_model.py", "sync/test_zero.py", "sync/test_zero2_direct.py", "sync/test_zero3_prefetch.py",
    "sync/test_zero_overlap_reduce.py",
    "telemetry/test_memory.py", "telemetry/test_target.py", "test_architecture.py", "test_multiproc.py",
    "test_resume.py", "tools/baselines/test_data_parallel.py", "tools/bench/test_collectives_bench.py",
    "tools/bench/test_time_to_accuracy.py", "tools/test_consolidate.py", "tools/costmodel/test_cli.py",
    "tools/costmodel/test_validation.py",
    "training/test_evaluation.py", "training/test_evaluation_lockstep.py", "tuning/test_tuning.py",
}
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if SYSTEM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)
        if item.path.relative_to(TESTS).as_posix() in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def write_idx_images(path: Path, images: torch.Tensor) -> None:
    """IDX3 (magic 0x0803, big-endian dims) gzipped, as the real files are."""
    n, h, w = images.shape
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">IIII", 0x0803, n, h, w))
        f.write(images.to(torch.uint8).numpy().tobytes())


def write_idx_labels(path: Path, labels: torch.Tensor) -> None:
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">II", 0x0801, len(labels)))
        f.write(labels.to(torch.uint8).numpy().tobytes())


def make_tiny_fashion_mnist(folder: Path, n_train: int = 512, n_test: int = 203, seed: int = 0) -> Path:
    """A learnable stand-in for Fashion-MNIST: class k is a bright bar at row 2k+4 plus noise.

    n_test is odd and prime on purpose, so no world size splits it evenly.
    """
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = torch.randint(0, 10, (n,), generator=g)
        images = torch.randint(0, 60, (n, 28, 28), generator=g)
        for i, k in enumerate(labels.tolist()):
            images[i, 2 * k + 4: 2 * k + 6, 4:24] = 250
        write_idx_images(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx_labels(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


@pytest.fixture(scope="session")
def tiny_fmnist(tmp_path_factory) -> Path:
    """A folder holding the four gzipped IDX files of a tiny Fashion-MNIST."""
    return make_tiny_fashion_mnist(tmp_path_factory.mktemp("tiny-fmnist"))


@pytest.fixture(scope="session", autouse=True)
def peak_cache(tmp_path_factory):
    """Runs started by tests measure their matmul peak (for MFU) into a file of the test
    session's, never into the user's ~/.cache/ddp_lab, where a peak measured while the
    suite loads the machine would stay. Runs in this process measure it with 0.5 s of
    warm-up and 3 timed calls, not 2 s and up to 10: a tested run's MFU needs no better
    figure, and the full measurement of each dtype and thread count cost 4-8 s."""
    from ddp_lab.telemetry import mfu
    path = tmp_path_factory.mktemp("peak") / "peak_flops.json"
    os.environ["DDP_LAB_PEAK_CACHE"] = str(path)
    saved = mfu.WARMUP_S, mfu.TIMED_S
    mfu.WARMUP_S, mfu.TIMED_S = 0.5, 0.0
    yield path
    mfu.WARMUP_S, mfu.TIMED_S = saved
    os.environ.pop("DDP_LAB_PEAK_CACHE", None)


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount_tmpfs(options) -> a fresh folder with a tmpfs mounted there (e.g. "ro,size=1m"),
    unmounted after the test; the test is skipped where mounting is not allowed (not root)."""
    mounted = []

    def mount(options: str) -> Path:
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def compose_train():
    """compose_train(overrides) -> the training config, as `python -m ddp_lab.train` would get it."""
    def _compose(overrides=()):
        with initialize_config_module(version_base="1.3", config_module="ddp_lab.conf"):
            return compose(config_name="train", overrides=for_the_data(overrides))
    return _compose


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_overrides(data_root: Path, run_dir: Path, cache: Path | None = None) -> list[str]:
    """Overrides that make a training run small, quick and self-contained."""
    cache = cache or run_dir.parent / "cache"
    return [f"data.root={data_root}", f"data.cache_dir={cache}", f"hydra.run.dir={run_dir}",
            "data.batch_size=64", "trainer.epochs=2", "trainer.warmup_steps=1",
            "trainer.log_every=2", "trainer.progress=false", "optim.warmup_epochs=0"]


def fit_alone(compose_train, data_root: Path, run_dir: Path, extra=()) -> dict:
    """A one-rank run of the trainer in this process (no torchrun) on tiny_overrides; its summary."""
    args = [o for o in tiny_overrides(data_root, run_dir) if not o.startswith("hydra.")]
    cfg = compose_train(args + ["trainer.amp=off", "trainer.threads=1", *extra])
    threads = torch.get_num_threads()
    trainer = Trainer.from_config(cfg, DistEnv(0, 1, 0, torch.device("cpu"), "none"), run_dir)
    try:
        return trainer.fit()
    finally:
        trainer.close()
        torch.set_num_threads(threads)


FASHION_MNIST_KEYS = ("data.root=", "data.cache_dir=")


def for_the_data(args) -> list[str]:
    """`args` without tiny_overrides' Fashion-MNIST keys where another dataset is chosen
    (data=synthetic has no data.root, and Hydra refuses a key a preset lacks)."""
    args = list(args)
    other = any(a.startswith("data=") and a != "data=fashion_mnist" for a in args)
    return [a for a in args if not (other and a.startswith(FASHION_MNIST_KEYS))]


def run_module(module: str, args, nproc: int = 1, timeout: float = 240,
               torchrun_args=(), env=None) -> subprocess.CompletedProcess:
    """Run `python -m module` (nproc=0) or `torchrun --nproc_per_node=nproc -m module`."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("RANK", None)
    args = for_the_data(args)
    if nproc == 0:
        cmd = [sys.executable, "-m", module, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{free_port()}", *torchrun_args, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def failure(proc: subprocess.CompletedProcess) -> str:
    """The part of a failed run's output worth reading: each rank's error, then the tail."""
    text = proc.stdout + proc.stderr
    errors = [ln for ln in text.splitlines() if "Error" in ln or "error:" in ln]
    return "\n".join(errors[:20]) + "\n...\n" + text[-2000:]


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


class NamedThread:
    """A sleeping thread that gives itself an OS name (what /proc/.../comm shows)
    after `delay_s`, as gloo's threads do when they start."""

    def __init__(self, name: str, delay_s: float = 0.0):
        self.named = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(name, delay_s), daemon=True)
        self.thread.start()
        while self.thread.native_id is None:
            pass
        self.tid = self.thread.native_id

    def _run(self, name, delay_s):
        self.stop.wait(delay_s)
        with open("/proc/thread-self/comm", "w") as f:
            f.write(name)
        self.named.set()
        self.stop.wait()

    def close(self):
        self.stop.set()
        self.thread.join()


def may_use_realtime() -> bool:
    """Whether this process may give a thread SCHED_FIFO (root, CAP_SYS_NICE, ulimit -r)."""
    if not os.path.isdir("/proc/thread-self"):  # not Linux: dist.comm_threads stays normal
        return False
    probe = NamedThread("probe")
    try:
        os.sched_setscheduler(probe.tid, os.SCHED_FIFO, os.sched_param(1))
        return True
    except PermissionError:
        return False
    finally:
        probe.close()


@pytest.fixture
def threads():
    made = []
    yield lambda name, delay_s=0.0: made.append(NamedThread(name, delay_s)) or made[-1]
    for t in made:
        t.close()


linux_only = pytest.mark.skipif(not os.path.isdir("/proc/thread-self"), reason="thread names come from Linux /proc")
needs_realtime = pytest.mark.skipif(not may_use_realtime(), reason="this process may not use SCHED_FIFO")
