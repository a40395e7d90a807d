"""The training config: every key's type, default, help and valid range, in one place.

Hydra composes conf/train.yaml on top of TrainConfig below, so it rejects
unknown keys, wrong types and values off a key's list itself (`trainer.amp=bf61`
-> "Invalid value 'bf61', expected one of [auto, bf16, fp16, off]"). The YAML
presets in conf/ (model=resnet18, data=synthetic) state only what
differs from these defaults. The sync group is typed by the chosen strategy's
own dataclass (`sync=diloco`: ddp_lab/sync/registry.py), which lists its keys. The model, data and optim groups are open
(ddp_lab.config.presets): each names a callable with `_target_`, the shipped presets
are typed by their own dataclass, a user's own preset may hold any keys. `check(cfg)` then refuses a value out of its
range, on every rank, before any rank joins the process group. A key with a
fixed list is a `Choice`, a str Enum compared with plain strings ("bf16").
`python -m ddp_lab.config.schema` prints the reference (docs/configuration.md).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ValidationError

from ddp_lab.config import ConfigError, presets
from ddp_lab.config.keys import TRI_STATE, choices, key, one_of, positive_finite

EVERY_K = re.compile(r"^every_[1-9][0-9]*$")  # trainer.activation_checkpointing=every_2
Amp = choices("Amp", "auto bf16 fp16 off")
Measure = choices("Measure", "full light off")
HostMalloc = choices("HostMalloc", "auto lean glibc keep")
Backend = choices("Backend", "auto gloo nccl")
Device = choices("Device", "auto cpu cuda")
CommThreads = choices("CommThreads", "auto realtime normal")


@dataclass
class TrainerConfig:
    epochs: int = key(10, "passes over the training set", at_least=1)
    max_steps: int = key(0, "stop after this many optimizer steps (0: no cap), for quick checks", at_least=0)
    log_every: int = key(50, "write the step's loss, lr and straggler times to TensorBoard every N steps",
                         at_least=1)
    warmup_steps: int = key(5, "steps left out of the throughput figures", at_least=0)
    eval_every_epochs: int = key(1, "evaluate every N epochs (the last always); 0: only at the end", at_least=0)
    eval_every_steps: int = key(0, "also evaluate every N optimizer steps (0: at epoch ends only)", at_least=0)
    target_acc: float = key(0.0, "the first evaluation whose held-out accuracy reaches this ends the run "
                                 "(classification; 0: no target)", ok=lambda v: 0 <= v <= 1, rule="in [0, 1]")
    target_loss: float = key(0.0, "the first evaluation whose held-out loss is at most this ends the run "
                                  "(0: no target)", at_least=0)
    stop_at_target: bool = key(True, "stop when the target is reached (false: note when, train on to the end)")
    amp: Amp = key(Amp.auto, "auto (bf16 where the hardware runs it fast) | bf16 | fp16 (CUDA) | off")
    channels_last: bool = key(True, "NHWC layout of image batches (other inputs as they are): faster bf16 convolutions")
    compile: str = key("auto", "torch.compile: auto (where each rank trains on 250,000+ samples and inductor "
                               "can build kernels) | true | false", ok=one_of(TRI_STATE),
                       rule="one of auto, true, false")
    threads: int = key(0, "torch threads per rank (0: keep the default; torchrun sets 1)", at_least=0)
    host_malloc: HostMalloc = key(HostMalloc.auto, "glibc's malloc on CPU ranks: auto (lean where stage 3 or fsdp "
                                                   "shards) | lean (freed blocks of 1 MiB+ returned: "
                                                   "lower peak, page faults) | glibc (its default: sharded steps "
                                                   "faster, peak higher) | keep (freed blocks under 64 MiB kept, "
                                                   "whatever came before: fewest page faults)")
    grad_accum: int = key(1, "micro-batches per optimizer step (no communication between them)", at_least=1)
    loss: Any = key({"_target_": None}, "the training loss by _target_: a class (torch.nn.HuberLoss) built with "
                                        "the other keys (+trainer.loss.delta=0.5), or a function of (outputs, "
                                        "targets); null: cross-entropy (regression: MSE)")
    activation_checkpointing: str = key("none", "keep each unit's inputs, recompute its forward in the backward "
                                                "(sync.shard_units' units, in every sync mode): none | units | "
                                                "every_<k> (every k-th unit, e.g. every_2)",
                                        ok=lambda v: str(v) in ("none", "units") or bool(EVERY_K.match(str(v))),
                                        rule="none, units or every_<k>")
    memory_check: bool = key(True, "refuse a CPU run whose estimated model state and activations per rank are "
                                   "more than the memory available to each rank (false: only warn)")
    progress: bool = key(True, "progress bar on rank 0 when attached to a terminal")
    ckpt_every_steps: int = key(0, "also checkpoint every N optimizer steps (0: only at epoch ends)", at_least=0)
    keep_ckpts: int = key(2, "keep the newest N checkpoints in <run dir>/checkpoints (0: write none)",
                          at_least=0)
    resume: str = key("none", "none | auto (this run dir's newest checkpoint) | a step-N directory "
                              "(into a new run dir)")
    preempt_save_s: float = key(20.0, "on SIGTERM or SIGINT (SLURM, Kubernetes, torchrun, Ctrl-C): finish the "
                                      "step, save a checkpoint at it and exit 143 within this many seconds "
                                      "(0: stop at once, no save)", at_least=0)
    straggler_threshold: float = key(1.2, "name a rank whose compute per step is this many times the "
                                          "others' median", at_least=1)
    measure: Measure = key(Measure.full, "what each step measures: full (train loss and accuracy, throughput, "
                                         "stragglers, communication time) | light (train loss, throughput) | "
                                         "off (throughput only); the divergence check runs at every level")
    profile: bool = key(False, "write a torch.profiler Chrome trace per rank to <run dir>/profile/")
    profile_wait: int = key(5, "steps skipped before profiling (plus one warm-up step)", at_least=0)
    profile_active: int = key(3, "steps recorded in the trace", at_least=1)


@dataclass
class DistConfig:
    backend: Backend = key(Backend.auto, "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")
    device: Device = key(Device.auto, "auto (cuda if available) | cpu | cuda (one GPU per rank, by LOCAL_RANK)")
    timeout_s: float = key(300.0, "a rank waiting longer than this (to join, in a collective) or making no "
                                  "progress (but for a first compile) names who is missing and stops",
                           ok=positive_finite, rule="a positive number of seconds")
    stall_warn_s: float = key(60.0, "training: a rank waiting longer than this in a collective logs who has "
                                    "not arrived (0: no warning)", at_least=0)
    comm_threads: CommThreads = key(CommThreads.normal, "opt-in: gloo's threads at real-time priority on CPU "
                                                        "ranks (realtime; auto: where the ranks fill every core); "
                                                        "paid on 2-core VMs whose ranks fill them (docs/defaults.md)")


@dataclass
class TrainConfig:
    # open: a preset (ddp_lab.config.presets) or a user's YAML says which keys they hold
    model: Any = field(default_factory=lambda: presets.base_defaults("model"))
    data: Any = field(default_factory=lambda: presets.base_defaults("data"))
    optim: Any = field(default_factory=lambda: presets.base_defaults("optim"))
    # the chosen strategy's options (ddp_lab/sync/registry.py: sync=<name> picks the dataclass that types it)
    sync: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    seed: int = key(0, "model init (the same on every rank) and the sampler's shuffle seed")


# every group's schema: the open ones (model, data, optim) by their base
# (sync: each strategy's own, ddp_lab/sync/registry.py)
GROUPS = {f.name: presets.BASES.get(f.name) or f.default_factory
          for f in dataclasses.fields(TrainConfig) if f.name not in ("seed", "sync")}


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    presets.register()


def _nested(f) -> type | None:
    """The dataclass a field holds (a config group), or None for a plain key."""
    if f.name in presets.BASES:
        return presets.BASES[f.name]
    if f.default_factory is dataclasses.MISSING:
        return None
    value = f.default_factory()
    return type(value) if dataclasses.is_dataclass(value) else None


def _nodes(node: type, prefix: str = ""):
    """(prefix, dataclass) for node and every group nested in it, depth first."""
    yield prefix, node
    for f in dataclasses.fields(node):
        if (sub := _nested(f)) is not None:
            yield from _nodes(sub, f"{prefix}{f.name}.")


def _schema_of(values, declared: type, group: str) -> type:
    """A group's node is typed by its preset's dataclass; a user's own preset is an open
    dict, checked against the group's base (the keys ddp_lab reads itself)."""
    actual = OmegaConf.get_type(values)
    if dataclasses.is_dataclass(actual) and issubclass(actual, declared):
        return actual
    if declared in presets.BASES.values():
        try:  # a user's preset is not typed by Hydra: type ddp_lab's own keys here
            own = {f.name for f in dataclasses.fields(declared)} - {"_target_"}
            OmegaConf.merge(OmegaConf.structured(declared), {k: values[k] for k in values if k in own})
        except ValidationError as e:
            raise ConfigError(f"{group}.{e.full_key}={e.value!r}: {str(e).splitlines()[0]}") from None
    return declared


def check(cfg, node: type = TrainConfig) -> None:
    """Refuse the first value out of its key's range, with one line naming the key and the range."""
    for prefix, declared in _nodes(node):
        values = OmegaConf.select(cfg, prefix[:-1]) if prefix else cfg
        if values is None:
            continue
        check_node(values, _schema_of(values, declared, prefix[:-1]) if prefix else declared, prefix)


def check_node(values, schema: type, prefix: str) -> None:
    """check() on one node typed by `schema` (a dataclass), its keys named `prefix<key>`."""
    for f in dataclasses.fields(schema):
        ok = f.metadata.get("ok")
        if f.name not in values or OmegaConf.is_missing(values, f.name):
            continue  # (an unset _target_ is said by who builds it)
        value = values.get(f.name)
        if ok is not None and value is not None and not ok(value):
            shown = list(value) if OmegaConf.is_list(value) else value
            raise ConfigError(f"{prefix}{f.name}={shown} must be {f.metadata['rule']}")


def _table(prefix: str, schema: type, level: int, title: str = "", only_new: bool = False) -> list[str]:
    base = {f.name for f in dataclasses.fields(schema.__mro__[1])} if only_new else set()
    return keys_table(prefix, schema, level, title, base)


def keys_table(prefix: str, schema: type, level: int, title: str = "", skip: set = frozenset()) -> list[str]:
    """A markdown table of a dataclass's keys (those with help; not `skip`) under a heading of `level`."""
    keys = [f for f in dataclasses.fields(schema)
            if _nested(f) is None and f.name not in skip and "help" in f.metadata]
    if not keys:
        return []
    lines = [f"{'#' * level} {title or prefix[:-1] or 'top level'}", "",
             "| key | default | meaning |", "|---|---|---|"]
    for f in keys:
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = "(the preset's)" if default == MISSING else f"`{_yaml(default)}`"
        rule = f" Must be {f.metadata['rule']}." if f.metadata.get("rule") else ""
        meaning = f"{f.metadata['help']}.{rule}".replace("|", "\\|")  # a table cell
        lines.append(f"| `{prefix}{f.name}` | {shown} | {meaning} |")
    return lines + [""]


def reference(node: type = TrainConfig, level: int = 3) -> str:
    """Every key of a config as markdown tables, one per group, under headings of `level`;
    for the open groups, their base keys, then each shipped preset's own keys."""
    lines = []
    for prefix, schema in _nodes(node):
        lines += _table(prefix, schema, level)
        group = prefix[:-1]
        for name, preset in presets.PRESETS.get(group, {}).items():
            users = ", ".join(f"{group}={p}" for p in _presets_on(group, f"schema_{name}"))
            lines += _table(prefix, preset, level, f"{group}.* of {users}", only_new=True)
    return "\n".join(lines)


def _presets_on(group: str, schema: str) -> list[str]:
    """The shipped presets of `group` built on `schema`, directly or through another preset."""
    folder = files("ddp_lab.conf") / group
    defaults = {p.name[:-5]: [str(d) for d in OmegaConf.load(str(p)).get("defaults", [])]
                for p in folder.iterdir() if p.name.endswith(".yaml")}
    on = {n for n, d in defaults.items() if schema in d}
    while more := {n for n, d in defaults.items() if n not in on and on & set(d)}:
        on |= more
    return sorted(on)


def _yaml(value) -> str:
    if value is None:
        return "null"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


if __name__ == "__main__":
    print(reference(), end="")
