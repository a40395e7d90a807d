"""trainer.host_malloc: the regime is the one asked for, seen in the page faults a freed block costs."""
import subprocess
import sys

import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.distributed import host_malloc

FAULTS = """
import resource, sys, torch
from ddp_lab.distributed import host_malloc
def faults(regime):  # page faults of 5 blocks of 8 MiB, each written and freed, after 3 more
    host_malloc.choose(regime)
    for i in range(8):
        if i == 3:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(2 << 20).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults(sys.argv[1]))
"""


@pytest.mark.skipif(host_malloc._glibc() is None, reason="needs glibc")
def test_lean_gives_every_freed_block_back_and_glibc_keeps_it():
    def faults(regime: str) -> int:  # (a process each: lean fixes the threshold for good)
        return int(subprocess.run([sys.executable, "-c", FAULTS, regime], capture_output=True, text=True,
                                  check=True).stdout)
    pages = (8 << 20) // 4096
    assert faults("lean") >= 5 * pages  # each block faulted in afresh
    # glibc's threshold grew past the first freed block: served from the heap since, where a freed block mostly
    # stays (0, 1 or 3 of the five faulted in again, in 15 runs here: the heap's top is trimmed now and then)
    assert faults("glibc") < 5 * pages


@pytest.mark.skipif(host_malloc._glibc() is None, reason="needs glibc")
def test_keep_keeps_freed_blocks_glibc_gives_back_whatever_came_before():
    """Blocks of 40 MiB, above the 32 MiB glibc's dynamic threshold stops at: glibc maps each afresh, keep serves
    them from the heap and keeps them."""
    # (six blocks before the five counted: a small block now and then splits the first freed one, and the next
    # is placed afresh once; 1 process in 3 under the three of FAULTS, none in 16 after six)
    script = FAULTS.replace("2 << 20", "10 << 20").replace("range(8)", "range(11)").replace("i == 3", "i == 6")

    def faults(regime: str) -> int:
        return int(subprocess.run([sys.executable, "-c", script, regime], capture_output=True, text=True,
                                  check=True).stdout)
    pages = (40 << 20) // 4096
    assert faults("glibc") >= 5 * pages
    kept = sorted(faults("keep") for _ in range(3))  # (three: the worst may still place one afresh)
    assert kept[0] < pages // 4 and kept[-1] < 2 * pages, kept
    assert host_malloc.keeps_freed_gathers("keep", torch.device("cpu"))


def test_the_estimate_prices_the_kept_gathers_of_a_sharded_model_only(compose_train):
    from ddp_lab.models.build import build_model
    from ddp_lab.sync.registry import options_of
    from ddp_lab.training.memory_estimate import transient_bytes
    cfg = compose_train(["model=gpt_small", "data=text", "sync=zero", "sync.zero_stage=3"])
    with torch.device("meta"):
        net = build_model(cfg.model)
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    opts = options_of(cfg.sync)
    assert transient_bytes(net, weights, 3, opts, True) - transient_bytes(net, weights, 3, opts) == 2 * weights
    assert transient_bytes(net, weights, 1, opts, True) == transient_bytes(net, weights, 1, opts)
    # fsdp under glibc on 2 emulated hosts peaked at 1,130 MiB at most, 950 predicted without the term
    # (docs/results/2026-12-04_zen5-2c_host-malloc): with it, within the fit check's error
    assert 1130 <= (950 + 2 * weights / 2**20) * 1.15


def test_auto_makes_a_sharded_cpu_rank_lean_and_another_choice_is_kept(monkeypatch):
    monkeypatch.setattr(host_malloc, "_state", {"choice": "auto", "applied": None})
    monkeypatch.setattr(host_malloc, "_set", lambda regime, refuse: host_malloc._state.update(applied=regime) or True)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert not host_malloc.for_sharded(torch.device("cuda", 0))
    host_malloc.choose("glibc")
    assert not host_malloc.for_sharded(torch.device("cpu")) and host_malloc._state["applied"] is None
    host_malloc.choose("auto")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the user's own: left alone
    assert not host_malloc.for_sharded(torch.device("cpu"))
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert host_malloc.for_sharded(torch.device("cpu")) and host_malloc._state["applied"] == "lean"


def test_without_glibc_an_explicit_regime_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(host_malloc, "_state", {"choice": "auto", "applied": None})
    monkeypatch.setattr(host_malloc, "_glibc", lambda: None)
    with pytest.raises(ConfigError, match=r"^trainer.host_malloc=lean needs glibc's mallopt, .*: use "
                                          r"trainer.host_malloc=auto or glibc$"):
        host_malloc.choose("lean")
    with pytest.raises(ConfigError, match=r"^trainer.host_malloc=keep needs glibc's mallopt, .*: use "
                                          r"trainer.host_malloc=auto or glibc$"):
        host_malloc.choose("keep")
    assert not host_malloc.for_sharded(torch.device("cpu"))  # auto: left alone there
