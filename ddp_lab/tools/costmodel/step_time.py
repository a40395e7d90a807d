"""A training step's time as the cost model prices it, beside the measured one.

    from ddp_lab.tools.costmodel.step_time import load_fit, predicted_step_ms
    fit = load_fit("outputs/costmodel/<run>/fit.csv")
    predicted_step_ms(fit, "flat/ring+bf16", "lenet", world=4, compute_ms=20.0)

step = compute + one all-reduce of the model's gradients, priced with the
fitted constants of the sync's algorithm (builtin: the ring formula) at the
world size; compressed syncs (sync.compress=bf16 or fp16) send half the bytes.
No overlap of communication with the backward pass is assumed.
Where ranks share cores, loopback_steps() gives their compute as measured
(see ddp_lab.tools.bench.scaling_prediction).
"""
from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from ddp_lab.config import ConfigError
from ddp_lab.tools.costmodel.formulas import MODELS, Params
from ddp_lab.tools.costmodel.prediction import resolve_gradient

HALF_PRECISION = ("bf16", "fp16")


def load_fit(path: str | Path) -> dict[str, Params]:
    """Fitted constants per algorithm from a cost model run's fit.csv."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return {r["algo"]: Params(float(r["alpha_s"]), float(r["beta_s_per_byte"]),
                                  float(r["gamma_s_per_byte"]), f"fit: {r['algo']} ({path})")
                for r in rows}
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"{path}: not a cost model fit.csv ({e}); run python -m ddp_lab.tools.costmodel "
                          "inputs=[...] and give its <run dir>/fit.csv") from None


@lru_cache(maxsize=None)
def _gradient_bytes(model: str) -> int:
    return resolve_gradient(model).nbytes


def allreduce_ms(fit: dict[str, Params], sync: str, model: str, world: int) -> float | None:
    """The all-reduce of one step, priced; None when the sync's algorithm was not fitted.

    sync is how summary.json describes it: mode/algo[+compress], e.g. flat/builtin+bf16.
    """
    mode_algo, _, compress = sync.partition("+")
    algo = mode_algo.rpartition("/")[2]
    if algo not in fit or algo not in MODELS:
        return None
    nbytes = _gradient_bytes(model) // (2 if compress in HALF_PRECISION else 1)
    return fit[algo].time(MODELS[algo], world, nbytes) * 1e3


def predicted_step_ms(fit: dict[str, Params], sync: str, model: str, world: int,
                      compute_ms: float) -> float | None:
    comm = allreduce_ms(fit, sync, model, world)
    return None if comm is None else compute_ms + comm


def loopback_steps(path: str | Path) -> dict[tuple[str, str, int, int], float]:
    """The measured step of each point of a loopback scaling study (its scaling.csv),
    by (kind, sync, ranks, batch per rank): compute under the same sharing of the
    cores as emulated hosts, with its memory-speed all-reduce in it."""
    try:
        with open(path, newline="") as f:
            return {(r["kind"], r["sync"], int(r["world_size"]), int(r["per_rank_batch"])): float(r["step_ms"])
                    for r in csv.DictReader(f) if r["step_ms"]}
    except (OSError, KeyError, ValueError) as e:
        raise ConfigError(f"{path}: not a bench.scaling scaling.csv ({e}); run python -m "
                          "ddp_lab.tools.bench.scaling --worlds ... and give its scaling.csv") from None
