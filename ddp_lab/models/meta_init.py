"""Building a model a unit at a time: on the meta device first (shapes, no memory), then each unit's weights
made, initialised and handed to the sharder (zero stage 3, fsdp), so that no rank ever holds the whole model,
as DeepSpeed's zero.Init and torchtitan's meta-device build do.

The weights are the whole build's at the same seed, on every rank, at any world size: the initialisation
is replayed as the model's constructor ran it. That holds where the constructor initialises by

1. each module's reset_parameters(), in the order the modules were made, a module after the layers it
   holds (torch's layers end their constructor so; the order is post-order, as for 2), then
2. the model's init_weights(module), if it has one, applied to every module in post-order (Module.apply's).

Both draw from the one CPU generator. To replay a unit alone, a first pass runs every module's reset on a
scratch copy, one module at a time, noting the generator's state before each (`MetaInit.__init__`); a unit
is then filled by its modules' resets from their noted states and the post-order walk of init_weights,
which visits each unit's modules together (`MetaInit.materialise`).

Whether a constructor is such is checked, not assumed: every in-place op it ran on a meta tensor is
recorded, and compared with the ops the replay runs, and every parameter and buffer must be written by
the replay. A model that differs (weights set in its constructor outside reset_parameters, a parameter
drawn by torch.randn in it, a buffer its constructor fills, a layer both tied and untied) is built whole
on every rank, with a line that says why and what would make it buildable a unit at a time.

A Hugging Face transformers model (a PreTrainedModel: `_init_weights(module)`) follows its library's
contract instead: its constructor's draws are thrown away by its own post_init, so the replay runs no
resets, only `_init_weights` on every module in post-order (each sub-model's own, as its
`initialize_weights` dispatches it), from the run's seed. Its weights are then the same under every sync
mode and at any world size (a whole build is re-initialised so too: `reinitialise_whole`), though not the
draws of the same model built outside a run. A model whose init_weights() takes no module (torchtitan's
`init_weights(buffer_device=None)`) initialises the whole at once: it is built whole on every rank.
"""
from __future__ import annotations

import copy
import inspect

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ddp_lab.config import ConfigError

NORM_BUFFERS = (nn.modules.batchnorm._NormBase,)  # buffers reset by their reset_parameters (running statistics)


class _InPlaceOps(TorchDispatchMode):
    """Records (op, shape, dtype, scalar arguments) of every in-place op on a meta tensor, and of every
    call of torch.nn.init's functions (some, such as orthogonal_, return at once on the meta device);
    `written`: the storages those ops wrote (a view's is its base's)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.written: set[int] = set()
        self.patched, self.inside = {}, 0

    def _note(self, name: str, t, rest) -> None:
        if isinstance(t, torch.Tensor) and t.is_meta:
            rest = tuple(a for a in rest if not isinstance(a, torch.Tensor))
            self.ops.append((name, tuple(t.shape), t.dtype, repr(rest)))
            self.written.add(_storage(t))

    def _wrap(self, name, fn):
        def recorded(tensor, *args, **kwargs):
            if not self.inside:  # (a torch function mode, such as torch.device's, calls it again)
                self._note(f"nn.init.{name}", tensor, (*args, *kwargs.values()))
            self.inside += 1
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                self.inside -= 1
        return recorded

    def __enter__(self):
        for name, fn in vars(nn.init).items():
            if name.endswith("_") and not name.startswith("_") and callable(fn):
                self.patched[name] = fn
                setattr(nn.init, name, self._wrap(name, fn))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, fn in self.patched.items():
            setattr(nn.init, name, fn)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable and args:
            self._note(func.name(), args[0], (*args[1:], *kwargs.values()))
        return func(*args, **kwargs)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _own(m: nn.Module) -> list[nn.Parameter]:
    return list(m.parameters(recurse=False))


def post_order(m: nn.Module):
    """The modules in the order Module.apply visits them: each module's children first, then itself."""
    for child in m.children():
        yield from post_order(child)
    yield m


def _resets(model: nn.Module) -> list[nn.Module]:
    """The modules with a reset_parameters(), each once, in the order their constructors ended."""
    seen, out = set(), []
    for m in post_order(model):
        if hasattr(m, "reset_parameters") and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def is_transformers(model: nn.Module) -> bool:
    """A Hugging Face PreTrainedModel (by its methods: transformers is not imported for this)."""
    return callable(getattr(model, "_init_weights", None)) and callable(getattr(model, "initialize_weights", None))


def module_init(model: nn.Module):
    """(the function that initialises one module or None, whether the modules' resets run first, "" or why the
    model's initialisation cannot be replayed a module at a time)."""
    if is_transformers(model):  # each module by the nearest PreTrainedModel's _init_weights, as it dispatches
        owner: dict[int, nn.Module] = {}

        def walk(m: nn.Module, parent: nn.Module) -> None:
            owner[id(m)] = m if is_transformers(m) else parent
            for child in m.children():
                walk(child, owner[id(m)])
        walk(model, model)
        return (lambda m: owner[id(m)]._init_weights(m)), False, ""
    init = getattr(model, "init_weights", None)
    if not callable(init):
        return None, True, ""
    takes = [p for p in inspect.signature(init).parameters.values()
             if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(takes) == 1:
        return init, True, ""
    return None, True, (f"its init_weights{inspect.signature(init)} takes no module: it initialises the whole model "
                        f"at once")


def _replay(model: nn.Module) -> None:
    """The initialisation this module replays, on whatever device the model is."""
    init, resets, _ = module_init(model)
    for m in _resets(model) if resets else ():
        m.reset_parameters()
    if init is not None:
        with torch.no_grad():
            for m in post_order(model):
                init(m)


def build_on_meta(build) -> tuple[nn.Module, str]:
    """(`build()`'s model on the meta device, why it cannot be replayed a unit at a time or "")."""
    with torch.device("meta"), _InPlaceOps() as made:
        model = build()
    why = module_init(model)[2]
    if why:
        return model, why
    with _InPlaceOps() as replayed:
        _replay(model)
    return model, _why_not(model, made.ops, replayed)


def _unwritten(model: nn.Module, written: set[int]) -> str:
    """The first parameter or buffer the replay leaves as it was made, described, or ""."""
    for path, m in model.named_modules():
        for kind, tensors in (("parameter", m._parameters), ("buffer", m._buffers)):
            for name, t in tensors.items():
                if t is not None and t.is_meta and _storage(t) not in written:
                    where = f"{path}.{name}" if path else name
                    if kind == "buffer":
                        return (f"{where} ({type(m).__name__}) is a buffer its constructor fills, which a meta-device "
                                f"build leaves empty")
                    if not hasattr(m, "reset_parameters") and module_init(model)[0] is None:
                        return (f"{where} ({type(m).__name__}) is in a module with no reset_parameters(), and no "
                                f"init_weights(module) writes it")
                    return (f"{where} ({type(m).__name__}) is made in its constructor (torch.randn, a tensor "
                            f"passed in), which the replay does not write")
    return ""


def _why_not(model: nn.Module, made: list, replay: _InPlaceOps) -> str:
    if unwritten := _unwritten(model, replay.written):
        return unwritten
    if is_transformers(model):  # (its constructor's draws are not what its weights are made by: see above)
        return ""
    replayed = replay.ops
    if made != replayed:
        at = next((i for i, (a, b) in enumerate(zip(made, replayed)) if a != b), min(len(made), len(replayed)))
        said = [f"{op[0]} on a tensor of shape {list(op[1])}" if op else "nothing"
                for op in (made[at] if at < len(made) else None, replayed[at] if at < len(replayed) else None)]
        return (f"its constructor initialises weights outside reset_parameters() and init_weights(module) "
                f"(its in-place op {at + 1} of {len(made)} is {said[0]}, the replay's {said[1]})")
    return ""


def advice(model: nn.Module, why: str) -> str:
    """The line a model built whole says."""
    return (f"model built whole on every rank: the model ({type(model).__name__}) is built whole, then sharded: "
            f"{why}. To build it a unit at a time, initialise each layer in its reset_parameters() and the rest "
            f"in a method init_weights(module) of the model, which the constructor ends with "
            f"self.apply(self.init_weights)")


def built_a_unit_at_a_time(model: nn.Module) -> str:
    """The line a model built a unit at a time says."""
    how = ("by its own _init_weights(module), a module at a time in post-order from the run's seed: the same "
           "under every sync mode and world size" if is_transformers(model) else
           "each layer's reset_parameters() and init_weights(module) replayed: the whole build's weights")
    return f"model built a unit at a time on the meta device, no rank holding it whole ({type(model).__name__}: {how})"


class MetaInit:
    """A meta-device model's initialisation, replayable a unit at a time (see the module docstring).
    Made right after the model, while the CPU generator is where the whole build's would be."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.paths = {id(m): path for path, m in model.named_modules(remove_duplicate=False)}
        self.init, self.use_resets, _ = module_init(model)
        self.resets = _resets(model) if self.use_resets else []
        self.states: dict[int, torch.Tensor] = {}  # id(module) -> the generator's state before its reset
        for m in self.resets:
            self.states[id(m)] = torch.get_rng_state()
            twin = copy.deepcopy(m).to_empty(device="cpu")  # a scratch copy: its draws, then dropped
            twin.reset_parameters()
            del twin
        self.after_resets = torch.get_rng_state()  # where init_weights starts drawing
        self.pretrained = None  # (weights, name in the model -> name in the file): copied into each unit as made
        self.read_mb = 0.0  # what this rank read of their safetensors files, MiB

    def load_from(self, weights) -> None:
        """Start from pretrained weights (checkpoint/pretrained.py's PretrainedWeights): checked against the
        model now, copied into each unit after its initialisation, before it is handed over."""
        self.pretrained = (weights, weights.match(self.model))

    def _fill(self, module: nn.Module, only: set[int]) -> None:
        if self.pretrained is not None:
            weights, found = self.pretrained
            weights.fill(module, self.paths[id(module)], found, only)

    def _reset(self, m: nn.Module) -> None:
        """Module m's reset, drawing what it drew in the whole build; the generator left as it was."""
        running = torch.get_rng_state()
        torch.set_rng_state(self.states[id(m)])
        with torch.no_grad():
            m.reset_parameters()
        torch.set_rng_state(running)

    def materialise(self, units: list[nn.Module], root: list[nn.Parameter], allocate, done, fill_rows=None) -> None:
        """Fill the weights unit by unit. `units`: modules whose parameters (but `root`) are allocated by
        allocate(i), real and writable, and handed over by done(i), after which they are not touched
        again. `root` (parameters no unit holds alone: tied ones, the model's own) must be real already
        and stay so; the caller hands them over after. The generator ends where the whole build's does.
        Pretrained weights are copied into each unit before done(i), or, given `fill_rows`, by the caller after
        it: fill_rows(i, rows), rows(name, lo, hi) reading rows [lo, hi) of the model's parameter `name` from
        the file, so that a rank reads only the part it keeps."""
        in_root = {id(p) for p in root}
        unit_of = {}
        for i, u in enumerate(units):
            for m in u.modules():
                unit_of.setdefault(id(m), i)
        written: set[int] = set()  # root parameters reset: the first module that owns one wins, as in a build
        for m in self.resets:
            own = _own(m)
            if own and all(id(p) in in_root for p in own) and not all(id(p) in written for p in own):
                self._reset(m)
                written.update(id(p) for p in own)
        torch.set_rng_state(self.after_resets)
        started = set()
        for m in post_order(self.model):
            i = unit_of.get(id(m))
            if i is not None and i not in started:
                started.add(i)
                allocate(i)
                for sub in _resets(units[i]) if self.use_resets else ():
                    if any(id(p) not in in_root for p in _own(sub)):
                        self._reset(sub)
            if callable(self.init):
                with torch.no_grad():
                    self.init(m)
            if i is not None and m is units[i]:
                if fill_rows is None or self.pretrained is None:
                    self._fill(units[i], {id(t) for t in (*units[i].parameters(), *units[i].buffers())} - in_root)
                    done(i)
                else:  # (the buffers whole; the parameters' rows after the caller has cut them)
                    self._fill(units[i], {id(b) for b in units[i].buffers()} - in_root)
                    done(i)
                    fill_rows(i, self.pretrained[0].rows_of(self.pretrained[1]))
        for i in range(len(units)):  # (a unit module the walk does not reach: none in a module tree)
            if i not in started:
                raise RuntimeError(f"unit {i} ({type(units[i]).__name__}) is not inside the model")
        self._fill(self.model, in_root | {id(b) for b in self.model.buffers()})  # (the root's, real and whole)
        if self.pretrained is not None:  # (its files closed: nothing of them stays in this process)
            self.read_mb = self.pretrained[0].bytes_read() / 2**20
            self.pretrained[0].close()


def swap_parameters(model: nn.Module, new_of: dict[int, nn.Parameter]) -> None:
    """Put new_of[id(p)] where each parameter p sits in the model (a tied parameter: in every place)."""
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None and id(p) in new_of:
                m._parameters[name] = new_of[id(p)]


def real_copy(p: nn.Parameter, device) -> nn.Parameter:
    """An uninitialised real parameter like meta parameter p."""
    return nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)


def make_the_rest_real(model: nn.Module, device) -> None:
    """Every parameter and buffer still on the meta device made real there, whole (uninitialised: the
    frozen parameters and buffers a sharder keeps whole on every rank; MetaInit fills them)."""
    swap_parameters(model, {id(p): real_copy(p, device) for p in model.parameters() if p.is_meta})
    real_buffers(model, device)


def real_buffers(model: nn.Module, device) -> None:
    """The model's meta-device buffers made real there (uninitialised: MetaInit fills them)."""
    for m in model.modules():
        for name, b in list(m._buffers.items()):
            if b is not None and b.is_meta:
                m._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)


def materialise_whole(model: nn.Module, init: MetaInit, device="cpu") -> nn.Module:
    """The whole model made real and initialised (what a whole build gives, for tests and small models)."""
    make_the_rest_real(model, device)
    init.materialise([], list(model.parameters()), lambda i: None, lambda i: None)
    return model


def reinitialise_whole(model: nn.Module, seed: int) -> None:
    """A whole-built transformers model given the weights a meta-device build gives it at `seed` (module_init),
    so that every sync mode starts it alike."""
    init = module_init(model)[0]
    torch.manual_seed(seed)
    with torch.no_grad():
        for m in post_order(model):
            init(m)


def refuse_unbuildable(model: nn.Module, why: str) -> None:
    """A model that declares init_weights(module) promises the replay: one that breaks it is refused."""
    if why and module_init(model)[0] is not None and not is_transformers(model):
        raise ConfigError(f"the model ({type(model).__name__}) cannot be built a unit at a time: {why}; "
                          f"initialise that in reset_parameters() or init_weights(module)")
