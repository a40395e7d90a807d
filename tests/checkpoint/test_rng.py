"""Every RNG state round-trips through a weights_only checkpoint file."""
import pytest
import torch

from ddp_lab import checkpoint
from tests.checkpoint.conftest import CPU


def test_numpy_and_python_rng_states_load_with_weights_only(tmp_path):
    np = pytest.importorskip("numpy")
    np.random.seed(3)
    state = checkpoint.rng_state(CPU)
    expected = np.random.rand(4)
    torch.save(state, tmp_path / "rng.pt")
    np.random.seed(0)
    checkpoint.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), CPU)
    assert (np.random.rand(4) == expected).all()
