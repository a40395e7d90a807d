"""The optimizer, its parameter groups and its learning-rate schedule, built from the optim config group."""
from __future__ import annotations

import fnmatch
import inspect
import math

import hydra.utils
import torch
from hydra.errors import InstantiationException

from ddp_lab.config import ConfigError, targets

# torch's optimizers whose step treats each element alone: on a flat chunk of many tensors (sync=zero)
# they do the math they do on the tensors (Adafactor's factored moments, LBFGS's line search do not)
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD")


def no_decay_names(model, rule) -> frozenset[str]:
    """The names (model.named_parameters()') of the parameters optim.no_decay keeps out of weight decay:
    none; 1d (every tensor of fewer than 2 dimensions: biases, norms' weights); or a list of fnmatch
    patterns over the names (a tied parameter by any of its names), 1d among them if wanted. A pattern
    that matches nothing is refused: it is a typo more often than not."""
    items = [rule] if isinstance(rule, str) else list(rule or [])
    items = [str(i) for i in items if str(i).lower() != "none"]
    if not items:
        return frozenset()
    canonical = {id(p): n for n, p in model.named_parameters()}
    out = set()
    for item in items:
        hits = {canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)
                if (p.dim() < 2 if item.lower() == "1d" else fnmatch.fnmatchcase(n, item))}
        if not hits:
            some = ", ".join(list(canonical.values())[:4])
            raise ConfigError(f"optim.no_decay: {item!r} matches no parameter of this model (its names are like "
                              f"{some}): fix the pattern, e.g. optim.no_decay=[1d,'*.bias']")
        out |= hits
    return frozenset(out)


def refuse_whole_tensor_optimizers(cfg, sync) -> None:
    """sync=zero hands the optimizer flat chunks of many tensors: an optimizer that is not known to
    treat each element alone (optim.elementwise) is refused in one line."""
    if not sync.caps.flat_shards:
        return
    declared = str(cfg.get("elementwise", "auto")).lower()
    name = str(cfg.get("_target_", "")).rsplit(".", 1)[-1]
    if declared == "true" or (declared == "auto" and str(cfg.get("_target_", "")).startswith("torch.optim.")
                              and name in ELEMENTWISE):
        return
    raise ConfigError(f"sync=zero steps flat chunks of many tensors, and {cfg.get('_target_')} is not known to "
                      f"treat each element alone (its math would differ): use sync=fsdp (whole tensors' "
                      f"rows), or set optim.elementwise=true if it does")


def kernels(cfg, device: torch.device) -> dict:
    """The arguments optim.implementation adds: auto picks torch's fused kernels on a GPU where the optimizer
    has them (they also let fp16's loss scaler skip a step without reading the device), else torch's default."""
    choice = str(cfg.get("implementation", "auto"))
    target = str(cfg.get("_target_", ""))
    try:
        takes = inspect.signature(hydra.utils.get_class(target)).parameters
    except Exception:  # (not a class: targets.build says so)
        takes = {}
    if choice == "auto":
        fused = device.type == "cuda" and target.startswith("torch.optim.") and "fused" in takes
        return {"fused": True} if fused else {}
    argument, value = {"fused": ("fused", True), "foreach": ("foreach", True), "for_loop": ("foreach", False)}[choice]
    if argument not in takes:
        raise ConfigError(f"optim.implementation={choice}: {target} takes no {argument!r} argument: leave "
                          f"optim.implementation=auto")
    return {argument: value}


def keep_kernels(optimizer) -> None:
    """A checkpoint's optimizer state brings its groups' options, the kernels among them: this launch's stay
    (a run saved on a CPU resumes fused on a GPU, and the other way round)."""
    def pre_hook(opt, state_dict):
        mine = opt.param_groups
        groups = [{**saved, **{k: now[k] for k in ("fused", "foreach") if k in now}}
                  for saved, now in zip(state_dict["param_groups"], mine)] + state_dict["param_groups"][len(mine):]
        return {**state_dict, "param_groups": groups}

    optimizer.register_load_state_dict_pre_hook(pre_hook)


def build_optimizer(cfg, params, device: torch.device | None = None):
    """The optimizer `cfg._target_` (the optim group) names; the schedule keys are ddp_lab's own, the kernels
    optim.implementation's (kept through a resume)."""
    try:
        optimizer = targets.build("optim", cfg, params=params, _convert_="all",  # (param groups: plain dicts)
                                  **kernels(cfg, device or torch.device("cpu")))
        keep_kernels(optimizer)
        return optimizer
    except InstantiationException as e:
        # torch.optim checks its own arguments ("Invalid learning rate: -1.0"): pass that on
        if isinstance(e.__cause__, ValueError):
            raise ConfigError(f"optim: {cfg._target_} refused these settings: {e.__cause__} "
                              "(fix the optim.* value it names)") from None
        raise


def warmup_steps(cfg, steps_per_epoch: int) -> int:
    """optim.warmup_steps where set, else optim.warmup_epochs in steps."""
    return cfg.warmup_steps if cfg.warmup_steps > 0 else int(cfg.warmup_epochs * steps_per_epoch)


def build_schedule(optimizer, cfg, steps_per_epoch: int, total_steps: int):
    """Per-step learning-rate multiplier: linear warm-up, then constant or cosine decay."""
    warmup = warmup_steps(cfg, steps_per_epoch)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
