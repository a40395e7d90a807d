"""The race against plain loops: its table, its commands, and a peer loop's pieces built as ddp_lab builds them."""
import argparse
import os
from pathlib import Path

import pytest
import torch

from ddp_lab.tools.bench.peers.__main__ import command, table


def test_the_table_gives_each_trainer_its_median_range_and_ratio_to_the_fastest_peer():
    rows = [{"system": s, "step_ms": ms, "stolen_s": st} for s, ms, st in [
        ("ddp_lab", 110.0, 0.0), ("ddp_lab", 90.0, 0.2), ("ddp_lab", 100.0, 0.0),
        ("plain_ddp", 80.0, 0.0), ("plain_ddp", 82.0, 0.0), ("plain_ddp", 78.0, 1.5),
        ("with_fabric", 95.0, 0.0), ("with_fabric", 90.0, 0.0), ("with_fabric", 99.0, 0.0)]]
    lines = table(rows, ["ddp_lab", "plain_ddp", "with_fabric"]).splitlines()
    assert lines[2] == "| ddp_lab | 100.0 | 90.0-110.0 | 3 | 1.250x | 0.2 s |"
    assert lines[3] == "| plain_ddp | 80.0 | 78.0-82.0 | 3 | 1.000x | 1.5 s |"
    assert lines[4] == "| with_fabric | 95.0 | 90.0-99.0 | 3 | 1.188x | 0.0 s |"


def test_every_system_gets_the_same_overrides_and_ddp_lab_the_same_steps():
    a = argparse.Namespace(overrides=["model=gpt", "optim=adamw"], steps=40, warmup=10, ddp_lab_args="sync=ddp")
    ours = command("ddp_lab", 2, Path("/r/ddp_lab-0"), a)
    peer = command("plain_ddp", 2, Path("/r/plain_ddp-0"), a)
    assert ours[ours.index("-m", 3) + 1] == "ddp_lab.train" and peer[peer.index("-m", 3) + 1].endswith("plain_ddp")
    assert {"model=gpt", "optim=adamw", "trainer.max_steps=40", "trainer.warmup_steps=10", "sync=ddp"} <= set(ours)
    assert {"model=gpt", "optim=adamw", "--steps=40", "--warmup=10"} <= set(peer) and "sync=ddp" not in peer
    a.variants = {"flat_one_buffer": "sync=flat sync.buffer_mb=0"}  # --variant: ddp_lab again, more overrides
    variant = command("flat_one_buffer", 2, Path("/r/flat_one_buffer-0"), a)
    assert variant[variant.index("-m", 3) + 1] == "ddp_lab.train" and variant[-3:] == [
        "sync=ddp", "sync=flat", "sync.buffer_mb=0"]


def test_a_peer_variant_runs_the_peer_under_its_environment(tmp_path, monkeypatch):
    from ddp_lab.tools.bench.peers import __main__ as race
    a = argparse.Namespace(overrides=["model=gpt"], steps=4, warmup=1, ddp_lab_args="", variants={},
                           peer_variants={"plain_keep": ("plain_ddp", {"MALLOC_TRIM_THRESHOLD_": "2147483647"})},
                           out=tmp_path, nproc=2, timeout=10)
    assert command("plain_keep", 2, tmp_path, a) == command("plain_ddp", 2, tmp_path, a)
    seen = {}

    def launched(cmd, env, **kw):  # the run's summary written as the peer would
        seen["env"] = env
        (tmp_path / "runs" / "plain_keep-0").mkdir(parents=True)
        (tmp_path / "runs" / "plain_keep-0" / "summary.json").write_text('{"step_ms": 12.5}')
        return argparse.Namespace(returncode=0, stdout="", stderr="")
    monkeypatch.setattr(race.subprocess, "run", launched)
    assert race.run("plain_keep", 0, a)["step_ms"] == 12.5
    assert seen["env"]["MALLOC_TRIM_THRESHOLD_"] == "2147483647" and seen["env"]["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize("spec", ["plain_keep=plain_ddp", "plain_keep=nosuch A=1", "plain_ddp=plain_ddp A=1",
                                  "plain_keep=plain_ddp A=", "plain_keep="])
def test_a_peer_variant_without_a_new_name_a_peer_and_a_setting_is_refused(tmp_path, spec):
    from ddp_lab.tools.bench.peers.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "r"), "--peer-variant", spec])
    assert "--peer-variant" in str(e.value.code) and "NAME='PEER VAR=VALUE ...'" in str(e.value.code)
    assert not (tmp_path / "r").exists()


def test_a_variant_is_not_the_peer_the_others_are_measured_against():
    rows = [{"system": s, "step_ms": ms, "stolen_s": 0.0} for s, ms in [
        ("ddp_lab", 100.0), ("ddp_lab_ddp", 50.0), ("plain_ddp", 80.0)]]
    lines = table(rows, ["ddp_lab", "ddp_lab_ddp", "plain_ddp"]).splitlines()
    assert lines[2].startswith("| ddp_lab | 100.0 |") and "| 1.250x |" in lines[2]
    assert "| 0.625x |" in lines[3]


def test_a_peer_builds_the_module_ddp_lab_builds_from_the_seed(compose_train):
    from ddp_lab.models import build_model
    from ddp_lab.tools.bench.peers.peer_parts import build, cross_entropy
    cfg = compose_train(["model=gpt", "data=text", "optim=adamw", "trainer.amp=off"])
    model, train, optimizer, loss, bf16 = build(cfg)
    torch.manual_seed(cfg.seed)
    ours = build_model(cfg.model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ours.state_dict().values()))
    opt = optimizer(model.parameters())
    assert type(opt).__name__ == "AdamW" and opt.defaults["lr"] == cfg.optim.lr and not bf16
    x, y = train[0]
    logits = model(x[None])
    assert loss is cross_entropy and loss(logits, y[None]).item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits[0], y).item(), rel=1e-6)


def test_a_peers_profile_records_the_steps_after_its_warm_up_as_ddp_labs_does(tmp_path):
    from ddp_lab.tools.bench import compare_profiles
    from ddp_lab.tools.bench.peers.peer_parts import StepClock

    clock = StepClock(3, profile_steps=2, out=tmp_path / "summary.json")
    loss = torch.zeros(())
    for _ in range(8):
        loss = torch.randn(4, 4).sum()
        clock.step_done()
    clock.write(tmp_path / "summary.json", loss)
    assert len(compare_profiles.read(str(tmp_path / "profile" / "rank0.json")).steps) == 2
    assert (tmp_path / "profile" / "rank0.txt").read_text().startswith("The 25 ops with the most self CPU time")
