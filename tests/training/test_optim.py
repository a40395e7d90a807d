"""The optimizer's groups (optim.no_decay) and what zero refuses to hand a whole-tensor optimizer."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from ddp_lab.config import ConfigError
from ddp_lab.models.gpt import gpt
from ddp_lab.sync.base import Capabilities
from ddp_lab.training.optim import build_optimizer, kernels, no_decay_names, refuse_whole_tensor_optimizers

GPT = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)


def test_no_decay_picks_1d_tensors_and_name_patterns():
    model = gpt(**GPT)
    assert no_decay_names(model, "none") == frozenset()
    one_d = no_decay_names(model, "1d")
    assert one_d == {n for n, p in model.named_parameters() if p.dim() == 1} and "blocks.0.ln1.weight" in one_d
    # a tied weight matches by either name, and is named once (the first): wte, shared with lm_head
    assert no_decay_names(model, ["1d", "lm_head.*"]) == one_d | {"wte.weight"}
    with pytest.raises(ConfigError, match=r"^optim.no_decay: '\*.bais' matches no parameter of this model \(its "
                                          r"names are like wte.weight, wpe.weight, .*\): fix the pattern, "
                                          r"e.g. optim.no_decay=\[1d,'\*.bias'\]$"):
        no_decay_names(model, ["*.bais"])


def test_the_groups_reach_the_optimizer_with_weight_decay_0():
    a, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    cfg = OmegaConf.create({"_target_": "torch.optim.AdamW", "lr": 0.1, "weight_decay": 0.1, "no_decay": "1d",
                            "elementwise": "auto", "schedule": "constant", "warmup_epochs": 0, "warmup_steps": 0,
                            "clip_grad_norm": 0.0})
    opt = build_optimizer(cfg, [{"params": [a]}, {"params": [b], "weight_decay": 0.0}])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["params"][0] is a and opt.param_groups[1]["params"][0] is b


@pytest.mark.parametrize("target,elementwise,refused", [
    ("torch.optim.AdamW", "auto", False), ("torch.optim.SGD", "auto", False),
    ("torch.optim.Adafactor", "auto", True), ("torch.optim.LBFGS", "auto", True),
    ("my_project.Lamb", "auto", True), ("my_project.Lamb", "true", False), ("torch.optim.AdamW", "false", True)])
def test_zero_refuses_an_optimizer_not_known_to_be_elementwise(target, elementwise, refused):
    cfg = OmegaConf.create({"_target_": target, "elementwise": elementwise})
    zero, fsdp = SimpleNamespace(caps=Capabilities(flat_shards=True)), SimpleNamespace(caps=Capabilities())
    refuse_whole_tensor_optimizers(cfg, fsdp)  # fsdp hands it each tensor's rows: never refused
    if not refused:
        refuse_whole_tensor_optimizers(cfg, zero)
        return
    with pytest.raises(ConfigError, match=rf"^sync=zero steps flat chunks of many tensors, and {target} is not "
                                          r"known to treat each element alone \(its math would differ\): use "
                                          r"sync=fsdp \(whole tensors' rows\), or set optim.elementwise=true "
                                          r"if it does$"):
        refuse_whole_tensor_optimizers(cfg, zero)


def optim_cfg(target="torch.optim.AdamW", implementation="auto"):
    return OmegaConf.create({"_target_": target, "lr": 0.1, "implementation": implementation, "no_decay": "none",
                             "elementwise": "auto", "schedule": "constant", "warmup_epochs": 0, "warmup_steps": 0,
                             "clip_grad_norm": 0.0})


@pytest.mark.parametrize("target,implementation,device,expected", [
    ("torch.optim.AdamW", "auto", "cuda", {"fused": True}),  # one launch; fp16 skips a step on the device
    ("torch.optim.SGD", "auto", "cuda", {"fused": True}),
    ("torch.optim.AdamW", "auto", "cpu", {}),  # torch's own default where no GPU is
    ("torch.optim.Adafactor", "auto", "cuda", {}),  # no fused kernels
    ("torch.optim.AdamW", "foreach", "cpu", {"foreach": True}),
    ("torch.optim.AdamW", "for_loop", "cuda", {"foreach": False}),
    ("torch.optim.AdamW", "fused", "cpu", {"fused": True}),
])
def test_optim_implementation_picks_torchs_kernels(target, implementation, device, expected):
    assert kernels(optim_cfg(target, implementation), torch.device(device)) == expected


def test_an_implementation_the_optimizer_lacks_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^optim.implementation=fused: torch.optim.Adafactor takes no 'fused' "
                                          r"argument: leave optim.implementation=auto$"):
        kernels(optim_cfg("torch.optim.Adafactor", "fused"), torch.device("cpu"))


def test_fused_steps_as_the_loop_does_and_a_resume_keeps_this_launchs_kernels():
    torch.manual_seed(0)
    w = torch.randn(64, 8)
    made = {}
    for implementation in ("for_loop", "fused"):
        p = torch.nn.Parameter(w.clone())
        opt = made[implementation] = build_optimizer(optim_cfg(implementation=implementation), [p])
        for _ in range(3):
            p.grad = torch.sin(p.detach() * 3)
            opt.step()
    loop, fused = made["for_loop"], made["fused"]
    assert loop.param_groups[0]["foreach"] is False and fused.param_groups[0]["fused"] is True
    torch.testing.assert_close(fused.param_groups[0]["params"][0], loop.param_groups[0]["params"][0])
    fused.load_state_dict(loop.state_dict())  # saved by the loop, resumed fused: fused it stays
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["foreach"] is None
    assert fused.state_dict()["state"][0]["step"].item() == 3
