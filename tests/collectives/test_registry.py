"""Choosing an all-reduce by name, and the inputs every one of them refuses
(no processes needed: each check runs before any communication)."""
from __future__ import annotations

import pytest
import torch

from ddp_lab import collectives
from ddp_lab.collectives import ALGORITHMS, TunedPlan, get_algorithm


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_non_contiguous_input_is_rejected(name):
    t = torch.arange(12.0).reshape(3, 4).t()
    with pytest.raises(ValueError, match=r"not contiguous; call \.contiguous\(\) first"):
        get_algorithm(name)(t)


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_dtypes_are_rejected(name, dtype):
    t = torch.zeros(5, dtype=dtype)
    with pytest.raises(TypeError) as info:
        get_algorithm(name)(t)
    message = str(info.value)
    assert str(dtype).replace("torch.", "") in message
    for ok in ("float32", "float64", "bfloat16", "float16"):
        assert ok in message


def test_unknown_algorithm_names_the_choices():
    with pytest.raises(ValueError) as info:
        get_algorithm("nope")
    message = str(info.value)
    assert "'nope'" in message
    for name in ("builtin", "naive", "ring", "halving_doubling", "ring_textbook", "halving_doubling_textbook",
                 "direct"):
        assert name in message
    assert set(ALGORITHMS) == {"builtin", "naive", "ring", "halving_doubling", "ring_textbook",
                               "halving_doubling_textbook", "direct"}


def test_a_plan_is_bound_to_the_tuned_algorithms_only():
    plan = TunedPlan(realtime_threads=True)
    for name in collectives.TUNED:
        fn = get_algorithm(name, plan)
        assert fn.func is ALGORITHMS[name] and fn.keywords == {"plan": plan}
    for name in ("builtin", "ring_textbook", "halving_doubling_textbook", "direct"):
        assert get_algorithm(name, plan) is ALGORITHMS[name]
    assert get_algorithm("ring") is ALGORITHMS["ring"]  # no plan: the default one (normal threads)
