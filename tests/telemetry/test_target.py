"""Training to a target: stop at the first evaluation that reaches it, and say how long it took."""
from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_lab.config import ConfigError
from tests.conftest import fit_alone


def _fit(compose_train, data, run_dir, extra=()):
    return fit_alone(compose_train, data, run_dir, ["optim.schedule=constant", *extra])


def test_a_run_stops_at_the_first_evaluation_that_reaches_its_target(compose_train, tiny_fmnist, tmp_path):
    # 8 steps an epoch; evaluated every 2 steps. First the curve, then a target on it.
    curve = _fit(compose_train, tiny_fmnist, tmp_path / "curve", ["trainer.eval_every_steps=2"])
    acc = EventAccumulator(str(tmp_path / "curve" / "tb"), size_guidance={"scalars": 0}).Reload()
    points = [(e.step, e.value) for e in acc.Scalars("acc/test")]
    assert [s for s, _ in points] == [2, 4, 6, 8, 10, 12, 14, 16]  # each step evaluation, once at epoch ends
    assert curve["target"] is None and curve["target_reached"] is None and curve["steps_to_target"] is None
    # by_time/: the same figures against milliseconds since the first step, increasing
    timed = acc.Scalars("by_time/acc_test")
    assert [e.value for e in timed] == [v for _, v in points]
    assert all(a.step < b.step for a, b in zip(timed, timed[1:]))

    # reached somewhere along the way; a hair under the logged value, which TensorBoard keeps in float32
    target = round(sorted(v for _, v in points)[len(points) // 2] - 1e-6, 6)
    first = next(s for s, v in points if v >= target)
    run = _fit(compose_train, tiny_fmnist, tmp_path / "target",
               ["trainer.eval_every_steps=2", f"trainer.target_acc={target}"])
    assert run["target"] == {"acc": target} and run["target_reached"] is True
    assert run["steps_to_target"] == first == run["steps"]  # stopped there
    assert run["test_acc"] >= target
    assert 0 < run["eval_s"] < run["time_to_target_s"] <= run["train_s"]
    assert run["eval_s_to_target"] == run["eval_s"]  # it stopped at the evaluation that reached it

    never = _fit(compose_train, tiny_fmnist, tmp_path / "never", ["trainer.target_loss=1e-6", "trainer.epochs=1"])
    assert never["target_reached"] is False and never["steps"] == 8 and never["time_to_target_s"] is None


@pytest.mark.parametrize("extra,says", [
    (["data=text", "model=gpt", "trainer.target_acc=0.5"], "needs a classification task"),
])
def test_a_target_that_cannot_be_judged_is_refused(compose_train, tiny_fmnist, tmp_path, extra, says):
    with pytest.raises(ConfigError, match=says):
        _fit(compose_train, tiny_fmnist, tmp_path / "run", extra)


@pytest.mark.parametrize("mode", ["local_sgd", "diloco"])
def test_evaluations_between_synchronisations_are_refused_at_start_up(compose_train, mode):
    from ddp_lab.training.builder import validate
    with pytest.raises(ConfigError, match=rf"trainer.eval_every_steps=6 must be a multiple of sync.every=4 "
                                          rf"with sync={mode}"):
        validate(compose_train([f"sync={mode}", "sync.every=4", "trainer.eval_every_steps=6"]))
    validate(compose_train([f"sync={mode}", "sync.every=4", "trainer.eval_every_steps=8"]))
    validate(compose_train(["sync=ddp", "trainer.eval_every_steps=6"]))  # every step synchronised
    with pytest.raises(ConfigCompositionException, match=r"Could not override 'sync.every'"):
        compose_train(["sync=ddp", "sync.every=4"])  # (a key of the periodic strategies alone)


def test_the_evaluations_bytes_and_collectives_up_to_the_target_are_kept_across_a_resume():
    from types import SimpleNamespace

    from ddp_lab.telemetry.target import TimeToTarget
    t = SimpleNamespace(target_acc=0.0, target_loss=2.0, eval_every_steps=4, stop_at_target=True)

    def sent(nbytes, calls):
        return {"wire_bytes": nbytes, "collectives": calls, "wire_bytes_across": nbytes // 2,
                "collectives_across": calls // 4}  # (islands, HSDP: a part of them between islands)
    first = TimeToTarget(t, "language_model")
    first.start()
    assert not first.evaluated({"loss/val": 2.5}, "val", 1.5, 4, sent=sent(4000, 8))
    state = first.state_dict(sent(6000, 12))  # a checkpoint after step 6: this launch sent 6000 bytes in 12 calls
    second = TimeToTarget(t, "language_model")  # resumed there: its own count starts at 0
    second.load_state_dict(state)
    second.start()
    assert not second.evaluated({"loss/val": 2.1}, "val", 0.5, 8, judged=False, sent=sent(1000, 4))  # not judged
    assert second.evaluated({"loss/val": 1.9}, "val", 0.25, 12, sent=sent(3000, 12))
    s = second.summary()
    assert s["steps_to_target"] == 12 and s["eval_s_to_target"] == 2.25
    assert s["wire_bytes_to_target"] == 9000 and s["collectives_to_target"] == 24
    assert s["wire_bytes_across_to_target"] == 4500 and s["collectives_across_to_target"] == 6
    assert not second.evaluated({"loss/val": 1.5}, "val", 1.0, 16, sent=sent(5000, 16))  # the first one counts
    assert second.summary()["wire_bytes_to_target"] == 9000 and second.summary()["eval_s"] == 3.25
    old = dict(state, reached={"step": 4, "seconds": 3.0})  # a checkpoint from before these were kept
    del old["wire_bytes"], old["collectives"], old["wire_bytes_across"], old["collectives_across"]
    third = TimeToTarget(t, "language_model")
    third.load_state_dict(old)
    assert third.summary()["eval_s_to_target"] is None and third.summary()["wire_bytes_to_target"] is None
    assert third.summary()["collectives_to_target"] is None and third.carried == sent(0, 0)
