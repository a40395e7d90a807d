"""`python -m ddp_lab.tools.costmodel`: validate the config, fit, predict, write the results.

Configuration: conf/costmodel.yaml. See ddp_lab.tools.costmodel for the model.
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import ddp_lab.config  # noqa: F401  (registers the ${ddp_lab.run_id:} resolver)
from ddp_lab.config import CONFIG_PATH, ConfigError
from ddp_lab.config.schema import check
from ddp_lab.telemetry.provenance import hydra_command, write_record
from ddp_lab.tools.cluster.shaping import ClusterError, parse_mtu, parse_rate  # tc's units for link rates
from ddp_lab.tools.costmodel.config import CostModelConfig
from ddp_lab.tools.costmodel.fitting import Fit, Point, expand_inputs, fit, fit_mixed, measure_gamma, read_points
from ddp_lab.tools.costmodel.formulas import MODELS, Params, get_model
from ddp_lab.tools.costmodel.prediction import Prediction, measure_compute_s, predict, resolve_gradient
from ddp_lab.tools.costmodel.report import plot_fits, plot_predictions, print_fits, print_predictions, write_csv
from ddp_lab.tools.costmodel.validation import print_beta_against_link, validate_held_out


def _gamma_setting(cfg) -> float | str:
    g = cfg.gamma
    if isinstance(g, str):
        if g in ("measure", "fit"):
            return g
        try:
            g = float(g)
        except ValueError:
            raise ConfigError(f"gamma={g!r} must be measure, fit, or seconds per byte (e.g. gamma=2.5e-10)") from None
    if isinstance(g, bool) or not isinstance(g, (int, float)) or g < 0:
        raise ConfigError(f"gamma={g!r} must be measure, fit, or a non-negative number of seconds per byte")
    return float(g)


def validate(cfg) -> dict:
    """Check keys before doing any work; returns the parsed settings."""
    check(cfg, CostModelConfig)  # types, choices and ranges; below, what needs more than one key
    params = [str(p) for p in cfg.params]
    for p in params:
        if p != "fitted" and p not in cfg.presets:
            raise ConfigError(f"params: {p!r} is neither 'fitted' nor a preset; presets: "
                              + ", ".join(cfg.presets))
    inputs = expand_inputs(list(cfg.inputs))
    if "fitted" in params and not inputs:
        raise ConfigError("params=fitted needs measurements: inputs=[path/to/collectives.csv, ...] "
                          "(from ddp_lab.tools.bench.collectives); or predict from a preset only, e.g. "
                          "'params=[ib_100g]'")
    for name in params:
        if name == "fitted":
            continue
        pre = cfg.presets[name]
        for key in ("alpha", "beta", "gamma"):
            v = pre.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"presets.{name}.{key}={v!r} must be a non-negative number")
    algos = [str(a) for a in cfg.algos]
    for a in algos:
        get_model(a)
    worlds = list(cfg.world_sizes)
    grads = [resolve_gradient(g) for g in cfg.gradients]
    compute_ms = dict(cfg.compute_ms or {})
    for g in grads:
        v = compute_ms.get(g.label)
        if v is None and g.model_name is None:
            raise ConfigError(f"gradients: {g.label} is a byte count, so its compute time cannot be "
                              f"measured; give it in ms per step, e.g. +compute_ms.{g.label}=50")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ConfigError(f"compute_ms.{g.label}={v!r} must be a non-negative number of milliseconds")
    cores, fit_min = cfg.measured_cores, cfg.fit_min_bytes
    held_out = expand_inputs(list(cfg.validate))
    if held_out and "fitted" not in params:
        raise ConfigError("validate=[...] checks the fitted constants: add fitted to params")
    link_bits, link_mtu = None, cfg.link_mtu
    try:
        link_mtu = parse_mtu(link_mtu)
        if cfg.link_rate is not None:
            link_bits = parse_rate(str(cfg.link_rate))
    except ClusterError as e:
        raise ConfigError(str(e).replace("--rate", "link_rate").replace("--mtu", "link_mtu")) from None
    return {"params": params, "inputs": inputs, "gamma": _gamma_setting(cfg), "algos": algos,
            "world_sizes": [int(w) for w in worlds], "gradients": grads, "compute_ms": compute_ms,
            "cores": cores, "validate": held_out, "link_bits": link_bits, "link_mtu": link_mtu,
            "fit_min_bytes": fit_min}


def run(cfg, run_dir: Path, log=print) -> dict:
    s = validate(cfg)
    if (run_dir / "predictions.csv").exists():
        raise ConfigError(f"hydra.run.dir={run_dir} already holds predictions.csv from an earlier "
                          "run; choose another hydra.run.dir (or leave it out: a new folder per run)")
    run_dir.mkdir(parents=True, exist_ok=True)
    fits: dict[str, Fit] = {}
    param_sets: dict[str, dict[str, Params]] = {}

    if "fitted" in s["params"]:
        points = read_points(s["inputs"], log)
        log(f"# MEASURED input: {len(points)} points from {len(s['inputs'])} file(s): "
            + ", ".join(str(p) for p in s["inputs"]))
        if not points:
            raise ConfigError("inputs hold no usable rows (all wrong > 0 or world_size 1)")
        if s["fit_min_bytes"]:
            points = [pt for pt in points if pt.size_bytes >= s["fit_min_bytes"]]
            log(f"# fitted on the {len(points)} of them of at least {s['fit_min_bytes']} bytes (fit_min_bytes)")
            if not points:
                raise ConfigError(f"fit_min_bytes={s['fit_min_bytes']} leaves no message to fit: the inputs' "
                                  "largest is smaller; lower it")
        gamma = s["gamma"]
        if gamma == "measure":
            gamma = measure_gamma(int(cfg.compute.threads))
            gamma_note = (f"MEASURED here, {gamma * 1e9:.4f} ns/B = {1e-9 / gamma:.2f} GB/s "
                          f"(float32 add_, {cfg.compute.threads} thread(s)); held fixed in the fit")
        elif gamma == "fit":
            gamma = None
            gamma_note = "fitted"
        else:
            gamma_note = f"given, {gamma * 1e9:.4f} ns/B; held fixed in the fit"
        by_algo: dict[str, list[Point]] = {}
        for pt in points:
            by_algo.setdefault(pt.algo, []).append(pt)
        for algo, pts in by_algo.items():
            if algo not in MODELS:
                log(f"# no cost model for measured algorithm {algo!r}: not fitted")
                continue
            try:
                fits[algo] = fit(pts, MODELS[algo], gamma, algo, source=f"fit: {algo}", cores=s["cores"])
            except ValueError as e:
                raise ConfigError(str(e)) from None
        # One parameter set for the machine, fitted to all measured
        # point-to-point algorithms at once (each row with its own formula):
        # used for algorithms that were not measured (e.g. tree).
        own = [pt for pt in points if pt.algo in MODELS and pt.algo != "builtin"]
        shared = None
        if own:
            rows = [(MODELS[pt.algo], pt) for pt in own]
            shared = fit_mixed(rows, gamma, s["cores"])
        if s["cores"]:
            log(f"# measured_cores={s['cores']}: measured p ranks modelled as max(1, p/{s['cores']}) x formula "
                "(ranks shared the cores); predictions assume one core or device per rank")
        else:
            log("# textbook formulas as they are (measured_cores=null: no correction for ranks sharing cores)")
        print_fits(fits, gamma_note, log)
        if shared is not None:
            med = statistics.median(abs(e) for e in shared[1])
            log(f"  {'shared (p2p algos)':<17} {len(own):>6} {shared[0].alpha * 1e6:>10.1f} "
                f"{shared[0].beta * 1e9:>11.4f} {1e-9 / shared[0].beta if shared[0].beta else math.inf:>9.3f} "
                f"{shared[0].gamma * 1e9:>11.4f} {med:>11.1%} {max(abs(e) for e in shared[1]):>9.1%}"
                "   (one set for naive+ring+halving_doubling; used for unmeasured algorithms)")
        if s["link_bits"]:
            print_beta_against_link(fits, s["link_bits"], s["link_mtu"], log)
        if s["validate"]:
            validate_held_out(fits, s["validate"], run_dir, log)
        fitted = {}
        for algo in s["algos"]:
            if algo in fits:
                fitted[algo] = fits[algo].params
            elif shared is not None:
                fitted[algo] = Params(shared[0].alpha, shared[0].beta, shared[0].gamma, "fit: shared")
            else:
                log(f"# fitted: no measurements and no shared fit for {algo}: not predicted")
        param_sets["fitted"] = fitted
        write_csv(run_dir / "fit.csv", [
            {"algo": a, "points": len(f.points), "alpha_s": f.params.alpha,
             "beta_s_per_byte": f.params.beta, "gamma_s_per_byte": f.params.gamma,
             "median_abs_rel_err": round(f.median_abs_err, 4), "max_abs_rel_err": round(f.max_abs_err, 4)}
            for a, f in fits.items()])
        write_csv(run_dir / "fit_points.csv", [
            {"algo": a, "world_size": pt.world_size, "size_bytes": pt.size_bytes,
             "measured_us": round(pt.time_s * 1e6, 3),
             "model_us": round(f.model_time(MODELS[a], pt) * 1e6, 3),
             "rel_err": round(e, 4)}
            for a, f in fits.items() for pt, e in zip(f.points, f.rel_errors)])
        if cfg.plot and fits:
            log(f"# wrote {plot_fits(fits, run_dir / 'fit.png')}")
    for name in s["params"]:
        if name == "fitted":
            continue
        pre = cfg.presets[name]
        p = Params(float(pre.alpha), float(pre.beta), float(pre.gamma), f"preset: {name}")
        param_sets[name] = {algo: p for algo in s["algos"]}
        log(f"# preset {name}: alpha {p.alpha * 1e6:g} us, beta {p.beta * 1e9:g} ns/B "
            f"({1e-9 / p.beta if p.beta else math.inf:g} GB/s), gamma {p.gamma * 1e9:g} ns/B -- "
            f"NOMINAL (vendor figures / assumptions, not measured): {pre.get('note', '')}")

    # compute time per step
    compute_s: dict[str, float] = {}
    notes: dict[str, str] = {}
    for g in s["gradients"]:
        given = s["compute_ms"].get(g.label)
        if given is not None:
            compute_s[g.label] = float(given) * 1e-3
            notes[g.label] = "given"
        else:
            compute_s[g.label] = measure_compute_s(g.model_name, int(cfg.compute.batch_size),
                                                   int(cfg.compute.iters), int(cfg.compute.threads))
            notes[g.label] = (f"MEASURED on this CPU: fwd+bwd+SGD, batch {cfg.compute.batch_size}/rank, "
                              f"{cfg.compute.threads} thread(s)")

    preds: list[Prediction] = []
    for pname, by_algo_params in param_sets.items():
        for g in s["gradients"]:
            for algo, params in by_algo_params.items():
                preds += predict(params, algo, g, s["world_sizes"], compute_s[g.label], pname)
    print_predictions(preds, s["world_sizes"], notes, log)
    if any(p != "fitted" for p in s["params"]):
        log("# presets price the network only; compute times above are the same for every params "
            "set, so give compute_ms for the hardware a preset stands for")
    if "fitted" in s["params"]:
        worlds = sorted({pt.world_size for f in fits.values() for pt in f.points})
        log(f"# fitted params come from world sizes {worlds} "
            "on one host; far larger worlds are an extrapolation of the formulas, not a measurement")
    write_csv(run_dir / "predictions.csv", [
        {"params": p.params_name, "params_from": p.params_from, "algo": p.algo, "gradient": p.gradient,
         "gradient_bytes": p.gradient_bytes, "world_size": p.world_size,
         "allreduce_s": f"{p.allreduce_s:.6g}", "compute_s": f"{p.compute_s:.6g}",
         "step_s": f"{p.step_s:.6g}", "efficiency": round(p.efficiency, 4)} for p in preds])
    log(f"# wrote {run_dir / 'predictions.csv'}")
    if cfg.plot:
        log(f"# wrote {plot_predictions(preds, run_dir / 'predictions.png')}")
    record = write_record(run_dir, hydra_command("ddp_lab.tools.costmodel"), {"inputs": [str(p) for p in s["inputs"]],
                          "validate": [str(p) for p in s["validate"]], "link_rate": cfg.get("link_rate")})
    log(f"# wrote {record}")
    return {"fits": fits, "params": param_sets, "predictions": preds, "compute_s": compute_s}


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="costmodel")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run(cfg, run_dir)
    except ConfigError as e:
        print(f"ddp_lab.tools.costmodel: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
