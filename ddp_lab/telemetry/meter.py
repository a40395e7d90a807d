"""What a rank measures while it trains: time, images per second, the epoch's sums.

* Clock: wall time that includes queued GPU work.
* Throughput: images per second over the whole steps after warm-up, with
  evaluation and checkpoints paused out of the window.
* Meter: one per Trainer; holds the above, the epoch's running sums
  (loss x images, correct, images) and the time spent waiting for data, and
  turns an epoch into the metrics TensorBoard gets, MFU among them (the
  model's FLOPs per image times images/s over the cores' measured peak,
  ddp_lab.telemetry.mfu).
"""
from __future__ import annotations

import math
import time

import torch

from ddp_lab.distributed import DistEnv, all_reduce_sum, ranks_on_machine
from ddp_lab.telemetry import mfu, position


class Clock:
    """Wall time that includes all queued device work (CUDA runs asynchronously)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Throughput:
    """Images per second over the steps after warm-up.

    The first `warmup_steps` of a run are left out (allocator, autotuning,
    torch.compile): the measured window opens when the last of them ends.
    `pause()`/`resume()` keep evaluation out of the window.
    """

    def __init__(self, clock: Clock, warmup_steps: int):
        self.clock, self.warmup = clock, warmup_steps
        self.seen = 0  # steps finished, warm-up included
        self.steps = 0  # steps inside the window
        self.images = 0
        self.seconds = 0.0
        self._t0: float | None = None

    def resume(self) -> None:
        if self.seen >= self.warmup and self._t0 is None:
            self._t0 = self.clock.now()

    def step_done(self, images: int) -> None:
        self.seen += 1
        if self._t0 is not None:
            self.images += images
            self.steps += 1
        elif self.seen == self.warmup:
            self._t0 = self.clock.now()

    def pause(self) -> None:
        if self._t0 is not None:
            self.seconds += self.clock.now() - self._t0
            self._t0 = None

    @property
    def per_sec(self) -> float:
        # NaN, not 0, when no step was measured (all warm-up): the window opened at its end
        return self.images / self.seconds if self.steps and self.seconds > 0 else float("nan")

    @property
    def step_ms(self) -> float:
        return 1000 * self.seconds / self.steps if self.steps else float("nan")


def flops_and_peak(model, example: torch.Tensor | dict, amp: str, env: DistEnv) -> tuple[float, float]:
    """The model's training FLOPs per sample like `example` (one input), and the measured matmul peak of the cores
    (or GPUs) the run uses, in the dtype it computes in (ddp_lab.telemetry.mfu; the peak is cached).

    The ranks that share a machine's cores are one host's, or, under ddp_lab.tools.cluster,
    every emulated host's: counting each emulated host as a machine of its own
    would put cores in the peak that the hosts in fact share.
    """
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp, torch.float32)
    sharing = ranks_on_machine(env.world_size)
    if isinstance(example, dict):  # (a dict batch's model, by keyword, on fake tensors: see mfu)
        flops = mfu.train_flops_per_sample(model, example, dtype)
    else:
        flops = mfu.train_flops_per_image(model, tuple(example.shape), dtype,
                                          input_dtype=None if example.is_floating_point() else example.dtype)
    return (flops, mfu.peak_for_run(env.device, dtype, env.world_size, sharing, torch.get_num_threads()))


def _mfu(flops_per_image: float, images_per_sec: float, peak: float) -> float:
    ok = peak > 0 and flops_per_image > 0 and math.isfinite(images_per_sec)
    return flops_per_image * images_per_sec / peak if ok else float("nan")


class Meter:
    """A rank's running measurements; end_epoch() turns them into an epoch's metrics."""

    def __init__(self, env: DistEnv, warmup_steps: int, flops_per_image: float = 0.0,
                 peak_flops: float = 0.0, full_step_images: int = 0, *, task,
                 targets_per_sample: int = 1):
        # task: how a batch is counted (ddp_lab.training.tasks.Task), handed down by the trainer
        self.env, self.task, self.targets_per_sample = env, task, targets_per_sample
        self.full_step_images = full_step_images  # a rank's images in a whole step (0: every step counts)
        self._short_step = False
        self.flops_per_image, self.peak_flops = flops_per_image, peak_flops
        self.clock = Clock(env.device)
        self.throughput = Throughput(self.clock, warmup_steps)
        self.sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss*n, correct, n (targets)
        self.counted = {"loss", "correct"}  # what add_batch counts (trainer.measure); the rest is NaN
        self.epoch_seconds: list[float] = []
        # the current epoch's seconds in earlier launches (a mid-epoch resume carries them)
        self.epoch_carried_s = 0.0
        self.data_seconds = 0.0
        self._epoch_start = (0.0, 0, 0.0)  # (clock, images, window seconds) at the epoch's start
        self._in_epoch = False

    def mfu(self, images_per_sec: float) -> float:
        """Model FLOPs utilisation at that global rate (NaN where unknown)."""
        return _mfu(self.flops_per_image, images_per_sec, self.peak_flops)

    @property
    def measuring(self) -> bool:
        """Whether the current step counts (past warm-up, and a whole step)."""
        return self.throughput.seen >= self.throughput.warmup and not self._short_step

    def start_epoch(self) -> None:
        tp = self.throughput
        self._epoch_start = (self.clock.now(), tp.images, tp.seconds)
        self._in_epoch = True
        tp.resume()

    def epoch_elapsed_s(self) -> float:
        """The current epoch's wall time so far, earlier launches' part included
        (what a checkpoint carries); 0 between epochs."""
        return self.epoch_carried_s + self.clock.now() - self._epoch_start[0] if self._in_epoch else 0.0

    def state_dict(self) -> dict:
        """What every rank shares (rank 0 saves it): the epochs' seconds, the current one's so far."""
        return {"epoch_seconds": list(self.epoch_seconds), "epoch_elapsed_s": self.epoch_elapsed_s()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch_seconds = list(state["epoch_seconds"])
        self.epoch_carried_s = state.get("epoch_elapsed_s", 0.0)  # (older checkpoints lack it)

    def own_state_dict(self) -> dict:
        """This rank's own: the partial epoch's sums."""
        return {"sums": self.sums.cpu()}

    def load_own_state_dict(self, own: dict) -> None:
        self.sums.copy_(own["sums"])  # a resumed epoch's metrics go on

    def add_batch(self, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        """A batch's (loss x targets, correct, targets), as its task counts them (ddp_lab.training.tasks)."""
        self.task.accumulate(self.sums, loss, out, y)

    def start_step(self, images_on_this_rank: int) -> None:
        """Keep a short step (an epoch's last, partial batch) out of the window, as warm-up is.

        Its new shape makes torch.compile compile the model again, inside the
        window: seconds against a step's milliseconds (the GPU training record in
        docs/results/README.md).
        """
        self._short_step = images_on_this_rank < self.full_step_images
        if self._short_step:
            self.throughput.pause()

    def step_done(self, images_on_this_rank: int) -> None:
        self.throughput.step_done(images_on_this_rank * self.env.world_size)
        if self._short_step:
            self.throughput.resume()
            self._short_step = False

    def end_epoch(self, lr: float, sync) -> dict:
        """The epoch's metrics over all ranks (one allreduce); resets the sums.

        With them, perf/comm_ms per step and perf/comm_frac of the step from the
        gradient sync, over the throughput window so far (like perf/step_ms);
        absent where not measured (see ddp_lab.sync)."""
        self.throughput.pause()
        seconds = self.epoch_elapsed_s()  # a resumed epoch's time counts its earlier part too
        _, images0, seconds0 = self._epoch_start
        self.epoch_seconds.append(seconds)
        self.epoch_carried_s, self._in_epoch = 0.0, False
        with position.collective("epoch metrics"):
            all_reduce_sum(self.sums, self.env)
        loss_sum, correct, n = self.sums.tolist()
        self.sums.zero_()
        if "correct" not in self.counted:  # not measured (trainer.measure): NaN, never 0
            correct = math.nan
        if "loss" not in self.counted:
            loss_sum = math.nan
        tp = self.throughput
        window = tp.seconds - seconds0
        rate = (tp.images - images0) / window if window > 0 and tp.images > images0 else float("nan")
        comm_ms, comm_frac = sync.comm_figures(tp.steps, tp.seconds)
        comm = {} if math.isnan(comm_ms) else {"perf/comm_ms": comm_ms, "perf/comm_frac": comm_frac}
        if tp.seen:  # this launch's bytes handed to all-reduces per step (ddp_lab.sync: wire_bytes)
            comm["comm/wire_bytes_per_step"] = sync.wire_bytes / tp.seen
            comm["comm/collectives_per_step"] = sync.collectives / tp.seen
        if self.task.name == "language_model":
            comm["perf/tokens_per_sec"] = rate * self.targets_per_sample
        return {
            **self.task.metrics(loss_sum, correct, n, "train"),
            "perf/samples_per_sec": rate,
            "perf/samples_per_sec_per_rank": rate / self.env.world_size,
            "perf/step_ms": tp.step_ms,
            "perf/data_ms": 1000 * self.data_seconds / max(tp.seen, 1),
            "perf/epoch_s": seconds,
            "lr": lr,
            "perf/mfu": self.mfu(rate),
            **comm,
        }
