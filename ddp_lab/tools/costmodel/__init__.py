"""Alpha-beta-gamma cost model of allreduce: fit it to measurements, predict at scale.

    # fit to benchmark runs (any world sizes; files, run directories or glob patterns),
    # predict 8..4096 ranks for LeNet and ResNet-18 (docs/costmodel.md, "The fit", runs
    # it on recorded sweeps)
    python -m ddp_lab.tools.costmodel 'inputs=[outputs/bench/collectives/*/collectives.csv]'
    # fit to 2-3 ranks, check the prediction of every point measured at 4 and 8 (validation.csv),
    # and set 1/beta beside the links' rate (see ddp_lab.tools.costmodel.validation)
    python -m ddp_lab.tools.costmodel 'inputs=[h2/collectives.csv,h3/collectives.csv]' \
        'validate=[h4/collectives.csv,h8/collectives.csv]' link_rate=1gbit
    # nominal interconnects instead of (or beside) the fit
    python -m ddp_lab.tools.costmodel 'params=[ib_100g,eth_25g]' 'compute_ms={lenet: 2, resnet18: 60}'

Configuration: conf/costmodel.yaml (Hydra, like every ddp_lab entry point).
Output: outputs/costmodel/<run id>/ with fit.csv, fit_points.csv, fit.png,
predictions.csv, predictions.png (and validation.csv with validate=[...]).

The model (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005) prices an allreduce of N bytes
on p ranks with three machine constants:

    alpha  seconds per message (latency, software overhead included)
    beta   seconds per byte sent over a link (1/beta = link bandwidth)
    gamma  seconds per byte reduced (the local additions)

and one formula per algorithm (MODELS in formulas.py). Every formula is linear in
alpha, beta and gamma, so fitting them to measured times is a least-squares
problem with non-negativity constraints.

What can and cannot be fitted: in all four formulas the bytes sent and the
bytes added come in the same 2:1 proportion (an allreduce sends every byte it
reduces twice: once to reduce, once to distribute), so the beta and gamma
columns of the design matrix are parallel and no measurement of allreduce
times can tell them apart. gamma therefore comes from elsewhere: `gamma:
measure` times an in-place float32 add on this machine (the operation the
algorithms run), or give a number; beta is then the per-byte cost left over.
`gamma: fit` is refused with that explanation whenever the columns are
dependent (it would be accepted for a model where they are not).

Fitting weights every point by 1/measured time, so the fit minimises the
relative error: a 4 KiB message counts as much as a 64 MiB one.

Oversubscribed measurements (`measured_cores`): the formulas assume that every
rank has its own processor and link. Benchmarks run as several processes on one
host with fewer cores than ranks break that: p ranks share c cores, so each
step of the collective takes about p/c times longer (at 4 ranks on 2 cores,
every algorithm's time roughly doubles on top of the formula's p-dependence).
With measured_cores=c, each measured point is modelled as
max(1, p/c) x formula(p, N) during the fit only; predictions are made for one
core (or device) per rank, i.e. without the factor. null (the default) fits the
plain textbook formulas.
"""
from ddp_lab.tools.costmodel.cli import run, validate
from ddp_lab.tools.costmodel.fitting import (
    CSV_COLUMNS,
    Fit,
    Point,
    contention,
    expand_inputs,
    fit,
    fit_mixed,
    measure_gamma,
    nnls,
    read_points,
)
from ddp_lab.tools.costmodel.formulas import (
    MODELS,
    Params,
    coefficients,
    direct,
    get_model,
    halving_doubling,
    naive,
    ring,
    tree,
)
from ddp_lab.tools.costmodel.prediction import Gradient, Prediction, measure_compute_s, predict, resolve_gradient

__all__ = [
    "CSV_COLUMNS", "Fit", "Gradient", "MODELS", "Params", "Point", "Prediction", "coefficients",
    "contention", "direct", "expand_inputs", "fit", "fit_mixed", "get_model", "halving_doubling",
    "measure_compute_s", "measure_gamma", "naive", "nnls", "predict", "read_points",
    "resolve_gradient", "ring", "run", "tree", "validate",
]
