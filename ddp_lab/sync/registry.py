"""The strategies by name: the one list a new strategy joins.

`register(name, options, strategy)` makes `sync=<name>` a choice of the sync group, typed by `options` (the
dataclass of its keys, beside its class), and ties it to the class that builds it (or to a function of the
options that picks one: zero's stage). `inside=` lets it run inside islands too (`sync/inner=<name>`, its keys
then under `sync.inner.`). Hydra learns the choices here, so a strategy needs no YAML file: the dataclass's
defaults are its preset. The choices the guides list, the islands' inside strategies and the configuration
reference all come from REGISTRY.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from ddp_lab.config import ConfigError
from ddp_lab.sync.options import SyncOptions


@dataclass(frozen=True)
class Strategy:
    name: str  # sync=<name>
    options: type  # the dataclass of its keys
    pick: Callable[[Any], type]  # options -> the class that builds it
    inside: dict | None  # None: not inside islands; else its keys' defaults there (over the options')


REGISTRY: dict[str, Strategy] = {}


def register(name: str, options: type, strategy: type | Callable[[Any], type], *, inside: dict | None = None) -> None:
    """`sync=<name>`: the strategy `strategy` (a class, or a function of the options returning one), keyed by
    `options`; `inside`: it may run inside islands, with these defaults there."""
    if not (dataclasses.is_dataclass(options) and issubclass(options, SyncOptions)):
        raise TypeError(f"sync={name}: its options must be a dataclass deriving from SyncOptions")
    pick = (lambda _opts, cls=strategy: cls) if isinstance(strategy, type) else strategy
    REGISTRY[name] = Strategy(name, options, pick, inside)
    store = ConfigStore.instance()
    store.store(group="sync", name=name, node=options)
    if inside is not None:
        store.store(group="sync/inner", name=name, node=options(**inside))


def entry(opts: SyncOptions) -> Strategy:
    """The registry's entry of these options (by their exact type)."""
    for s in REGISTRY.values():
        if type(opts) is s.options:
            return s
    raise ConfigError(f"{type(opts).__name__} is no registered sync strategy's options")


def name_of(opts: SyncOptions) -> str:
    return entry(opts).name


def options_of(node) -> SyncOptions:
    """The sync group as its strategy's options (a dataclass), from Hydra's node or as it is. `sync.inner=<name>`
    typed as a plain key (rather than `sync/inner=<name>`) names that strategy at its defaults inside."""
    if isinstance(node, SyncOptions):
        return node
    if not isinstance(node, DictConfig) or not issubclass(OmegaConf.get_type(node) or dict, SyncOptions):
        raise ConfigError("the sync group names no strategy: choose one with sync=<name> "
                          f"({', '.join(REGISTRY)})")
    opts = OmegaConf.to_object(node)
    inner = getattr(opts, "inner", None)
    if isinstance(inner, str):
        opts = dataclasses.replace(opts, inner=inner_options(inner))
    return opts


def inner_options(name: str, **keys) -> SyncOptions:
    """The options of strategy `name` as it runs inside islands."""
    s = REGISTRY.get(name)
    if s is None or s.inside is None:
        raise ConfigError(f"sync.inner={name}: inside islands runs one of {', '.join(inside_choices())}")
    return s.options(**{**s.inside, **keys})


def inside_choices() -> list[str]:
    return [n for n, s in REGISTRY.items() if s.inside is not None]


def resolved(opts: SyncOptions, device: torch.device) -> SyncOptions:
    """The options of the strategy that runs on this device (sync=auto: flat's on CPU, ddp's on GPUs)."""
    return opts.resolved(device)


CPU = torch.device("cpu")


def strategy_class(opts: SyncOptions, device: torch.device = CPU) -> type:
    """The class that builds these options' strategy on this device."""
    opts = resolved(opts, device)
    return entry(opts).pick(opts)


def check(opts: SyncOptions, prefix: str = "sync.") -> None:
    """Every key in its range, then the strategy's own rules between its keys (and its inner strategy's, inside
    islands), each refusal one line naming the keys."""
    from ddp_lab.config.schema import check_node
    check_node(OmegaConf.structured(opts), type(opts), prefix)
    opts.check(name_of(opts))
    inner = getattr(opts, "inner", None)
    if isinstance(inner, SyncOptions):
        check(inner, prefix + "inner.")


def refuse_foreign_keys(overrides: list[str], default: str = "auto") -> None:
    """A `sync.<key>=` override the chosen strategy does not take: one line naming the strategies that do
    (Hydra's own refusal names the dataclass, in several lines)."""
    from ddp_lab.config.renamed import key_of
    chosen = default
    for o in overrides:
        if o.startswith("sync=") or o.startswith("+sync="):
            chosen = o.split("=", 1)[1]
    if chosen not in REGISTRY:
        if "," in chosen or "(" in chosen:  # a sweep over strategies: Hydra checks each job
            return
        raise ConfigError(f"sync={chosen} is no strategy: choose one of {', '.join(REGISTRY)}")
    own = {f.name for f in dataclasses.fields(REGISTRY[chosen].options)}
    for o in overrides:
        k = key_of(o)
        if not k.startswith("sync.") or k.count(".") != 1 or o.startswith("+"):
            continue
        name = k.split(".", 1)[1]
        if name not in own:
            takers = [n for n, s in REGISTRY.items() if name in {f.name for f in dataclasses.fields(s.options)}]
            where = f"; it is a key of sync={', sync='.join(takers)}" if takers else ""
            raise ConfigError(f"{k} is not a key of sync={chosen}{where}: `python -m ddp_lab.sync.reference` "
                              f"lists each strategy's keys")
