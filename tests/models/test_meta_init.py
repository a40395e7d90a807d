"""A model built a unit at a time on the meta device (models/meta_init.py): the whole build's weights, exactly,
whatever the world size; models whose initialisation cannot be replayed said so; memory held while building."""
import ctypes

import pytest
import torch
import torchvision
from torch import nn

from ddp_lab.config import ConfigError
from ddp_lab.models.gpt import gpt
from ddp_lab.models.lenet import lenet
from ddp_lab.models.meta_init import MetaInit, advice, build_on_meta, materialise_whole, refuse_unbuildable
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg

SMALL_GPT = dict(vocab_size=50, block_size=16, n_layer=3, n_head=2, n_embd=32)
MODELS = {
    "gpt": lambda: gpt(**SMALL_GPT),
    "lenet": lambda: lenet(),
    "lenet_d2l": lambda: lenet(init="d2l"),
    "a user's Sequential": lambda: nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2)),
    "a user's module with its own reset": lambda: Scaled(),
}


class Scaled(nn.Module):
    """A user's layer that initialises itself in reset_parameters(), as torch's do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.scale = nn.Parameter(torch.empty(6))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.uniform_(self.scale, 0.5, 1.5)

    def forward(self, x):
        return self.lin(x) * self.scale


def _whole(build, seed=3):
    torch.manual_seed(seed)
    return build(), torch.rand(4)  # (what the generator gives next: where the build left it)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_meta_build_made_whole_equals_the_whole_build(name):
    whole, after = _whole(MODELS[name])
    torch.manual_seed(3)
    model, why = build_on_meta(MODELS[name])
    assert why == ""
    materialise_whole(model, MetaInit(model))
    assert torch.equal(torch.rand(4), after)  # the generator left where the whole build leaves it
    a, b = whole.state_dict(), model.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    if name == "gpt":
        assert model.lm_head.weight is model.wte.weight  # still tied


class InitInConstructor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        nn.init.orthogonal_(self.lin.weight)  # outside reset_parameters and init_weights


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("mask", torch.tril(torch.ones(3, 3)))


def test_what_cannot_be_replayed_is_named():
    _, why = build_on_meta(lambda: torchvision.models.resnet18(num_classes=10))
    assert "its constructor initialises weights outside reset_parameters()" in why
    # torchvision makes a block's downsampling layer before the block (and re-initialises every layer after)
    assert ("(its in-place op 46 of 304 is nn.init.kaiming_uniform_ on a tensor of shape [128, 64, 1, 1], the "
            "replay's nn.init.kaiming_uniform_ on a tensor of shape [128, 64, 3, 3])") in why
    _, why = build_on_meta(InitInConstructor)
    assert "outside reset_parameters()" in why
    model, why = build_on_meta(Masked)
    assert why == "mask (Masked) is a buffer its constructor fills, which a meta-device build leaves empty"
    assert advice(model, why).startswith("model built whole on every rank: the model (Masked) is built whole, then "
                                          "sharded: mask (Masked) is a buffer")
    refuse_unbuildable(model, why)  # (no init_weights: built whole, not refused)


def test_a_model_that_declares_init_weights_and_breaks_it_is_refused():
    class Broken(InitInConstructor):
        def init_weights(self, m):
            pass

    model, why = build_on_meta(Broken)
    with pytest.raises(ConfigError, match=r"^the model \(Broken\) cannot be built a unit at a time: its constructor"):
        refuse_unbuildable(model, why)


# ------------------------------------------------------------ under zero stage 3 and fsdp, at 2 and 3 ranks
def _allocated() -> int:
    """Bytes glibc's malloc has handed out and not taken back (not RSS: an untouched block counts)."""
    class MallInfo2(ctypes.Structure):
        _fields_ = [(f, ctypes.c_size_t) for f in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def _sharded_build(rank, world_size, mode, big):
    from ddp_lab.distributed import DistEnv
    from ddp_lab.sync import SyncContext, build_sync

    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    cfg = sync_cfg("zero", "builtin", zero_stage=3, bucket_cap_mb=0.1) if mode == "zero3" else sync_cfg("fsdp")
    shape = dict(vocab_size=512, block_size=16, n_layer=6, n_head=4, n_embd=256) if big else SMALL_GPT
    torch.manual_seed(5)
    model, why = build_on_meta(lambda: gpt(**shape))
    init = MetaInit(model)
    peaks, base = [], _allocated()
    materialise = init.materialise

    def watched(units, root, allocate, done, fill_rows=None):  # the bytes held after each unit is made, before cut
        def allocated(i):
            allocate(i)
            peaks.append(_allocated() - base)
        return materialise(units, root, allocated, done, fill_rows)

    init.materialise = watched
    sync = build_sync(cfg, model, env, SyncContext(init=init))
    after = torch.rand(2)
    with sync.whole_weights() if mode == "zero3" else torch.no_grad():
        state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).clone()
                 for k, v in model.state_dict().items()}
    torch.manual_seed(5)
    whole, whole_after = gpt(**shape), torch.rand(2)
    differ = [k for k, v in whole.state_dict().items() if not torch.equal(state[k], v)]
    block = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    return differ, torch.equal(after, whole_after), max(peaks), block, sum(p.numel() * 4 for p in whole.parameters())


@pytest.mark.parametrize("mode", ["zero3", "fsdp"])
def test_sharded_builds_give_the_whole_builds_weights_at_2_and_3_ranks(mode):
    for n in (2, 3):
        for differ, generator_as_whole, *_ in run_in_processes(_sharded_build, n, mode, False):
            assert differ == [] and generator_as_whole


@pytest.mark.parametrize("mode", ["zero3", "fsdp"])
def test_a_rank_building_holds_its_shards_the_root_and_one_unit(mode):
    """The heap while each unit is made: this rank's shards, the root (the tied embedding, whole until
    all are made) and the unit being made, never the whole model."""
    for _, _, peak, block, model_bytes in run_in_processes(_sharded_build, 2, mode, True):
        root = 512 * 256 * 4
        # the whole model: 19.5 MB (6 blocks of 3.1 MB, the 0.5 MB embedding); half of it is this rank's shards
        assert peak < 0.75 * model_bytes
        # (fsdp makes each unit's shards as it cuts it; zero stage 3 all of this rank's at once, first)
        assert block <= peak <= model_bytes / 2 + root + block + 2**20, (peak, model_bytes, block)


class DrawnInConstructor(nn.Module):
    """A ViT-style position embedding: drawn out of place in the constructor, so no in-place op to record."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.pos = nn.Parameter(torch.randn(1, 3) * 0.02)


class WholeModelInit(nn.Module):
    """torchtitan's convention: init_weights initialises the whole model, taking no module."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.init_weights()

    def init_weights(self, buffer_device=None):
        nn.init.zeros_(self.lin.weight)


def test_a_parameter_drawn_out_of_place_or_a_whole_model_init_is_built_whole():
    _, why = build_on_meta(DrawnInConstructor)
    assert why == ("pos (DrawnInConstructor) is in a module with no reset_parameters(), and no init_weights(module) "
                   "writes it")

    class DrawnDespiteInit(DrawnInConstructor):
        def init_weights(self, m):
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.weight)

    _, why = build_on_meta(DrawnDespiteInit)
    assert why == ("pos (DrawnDespiteInit) is made in its constructor (torch.randn, a tensor passed in), which the "
                   "replay does not write")
    model, why = build_on_meta(WholeModelInit)
    assert why == "its init_weights(buffer_device=None) takes no module: it initialises the whole model at once"
    refuse_unbuildable(model, why)  # (built whole, with the line: not refused)
