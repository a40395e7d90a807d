"""Building what a config group names with `_target_` (a model, a dataset, an
optimizer): the group's own keys are ddp_lab's, every other key is an argument.
Each way a user's callable can fail to build becomes one line naming the key
and the fix."""
from __future__ import annotations

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError
from ddp_lab.config.presets import OWN_KEYS


def arguments(group: str, node) -> dict:
    """The group's keys that go to its callable (ddp_lab's own and unset ones left out)."""
    plain = OmegaConf.to_container(node, resolve=True, enum_to_str=True) if OmegaConf.is_config(node) else node
    return {k: v for k, v in plain.items() if k not in OWN_KEYS.get(group, ()) and k != "_target_"}


def resolve(group: str, node):
    """The callable `group._target_` names, or one line saying why it is not one."""
    missing = node is None or "_target_" not in node or (
        OmegaConf.is_config(node) and OmegaConf.is_missing(node, "_target_"))
    target = None if missing else node["_target_"]
    if not target:
        raise ConfigError(f"{group}._target_ is not set: name the callable that builds it, "
                          f"e.g. {group}._target_=my_package.my_module.my_function")
    try:
        obj = get_object(target)
    except Exception as e:  # ImportError, AttributeError, and what the module raises on import
        cause = str(e.__cause__ or e).strip().splitlines()[0] if str(e.__cause__ or e).strip() else type(e).__name__
        raise ConfigError(f"{group}._target_={target} does not import ({cause}): check the dotted path and "
                          f"that its package is importable (pip install -e <project>, or PYTHONPATH)") from None
    if not callable(obj):
        raise ConfigError(f"{group}._target_={target} is a {type(obj).__name__}, not a callable: name a "
                          f"function or class that builds the {group}")
    return obj


def build(group: str, node, **extra):
    """Call `group._target_` with the group's arguments (and `extra`, e.g. an optimizer's params)."""
    resolve(group, node)
    args = {"_target_": node["_target_"], **arguments(group, node)}
    try:
        return instantiate(args, **extra)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ConfigError):  # a bad value, not a bug: say it plainly
            raise cause from None
        if isinstance(cause, TypeError) and "unexpected keyword" in str(cause):
            key = str(cause).rsplit("'", 2)[-2]
            preset = (f" (or, for a {group} other than the preset's, start from {group}=custom)"
                      if group in OWN_KEYS else "")  # (trainer.loss has no presets)
            raise ConfigError(f"{group}.{key} is not an argument of {node['_target_']}: drop it{preset}") from None
        if isinstance(cause, TypeError) and "missing" in str(cause) and "required" in str(cause):
            raise ConfigError(f"{group}: {node['_target_']} needs an argument: {cause}; add it as "
                              f"+{group}.<name>=<value> or in your {group} YAML") from None
        raise
