"""checkpoint/safetensors_reader.py: the tensors safetensors' own writer wrote, whole or a run of rows, and a
file that is not one refused."""
from __future__ import annotations

import pytest
import torch

from ddp_lab.checkpoint.safetensors_reader import SafetensorsReader


def test_it_reads_what_safetensors_wrote_whole_or_a_run_of_rows(tmp_path):
    from safetensors.torch import save_file
    tensors = {"w": torch.randn(5, 3), "ids": torch.arange(7), "half": torch.randn(4, 2).bfloat16(),
               "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5), "mask": torch.tensor([True, False])}
    save_file(tensors, tmp_path / "x.safetensors")
    reader = SafetensorsReader(tmp_path / "x.safetensors")
    assert sorted(reader.keys()) == sorted(tensors) and reader.shape("w") == (5, 3)
    for name, t in tensors.items():
        assert torch.equal(reader.get_tensor(name), t), name
    before = reader.bytes_read
    assert torch.equal(reader.get_tensor("w", (1, 4)), tensors["w"][1:4])
    assert reader.bytes_read - before == 3 * 3 * 4  # those rows' bytes, no more
    assert torch.equal(reader.get_tensor("half", (3, 4)), tensors["half"][3:4])
    assert reader.get_tensor("w", (2, 2)).shape == (0, 3)


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        SafetensorsReader(tmp_path / "x.safetensors")
