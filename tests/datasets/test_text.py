"""Plain text as byte tokens: windows shifted by one, a held-out tail, clear refusals."""
import pytest
import torch

from ddp_lab.config import ConfigError
from ddp_lab.datasets.text import read_corpus, text_corpus


def test_each_target_is_the_next_byte_and_validation_is_the_tail(tmp_path):
    text = bytes(range(256)) * 4  # 1024 bytes
    (tmp_path / "a.txt").write_bytes(text)
    train, val = text_corpus(str(tmp_path / "a.txt"), block_size=10, val_fraction=0.25)
    assert (len(train), len(val)) == ((768 - 1) // 10, (256 - 1) // 10)
    x, y = train[3]
    assert x.tolist() == list(range(30, 40)) and y.tolist() == list(range(31, 41))
    assert val[0][0].tolist() == list(range(0, 10))  # the last quarter starts at byte 768 = 0 mod 256
    assert x.dtype == y.dtype == torch.long


def test_a_folder_is_read_in_name_order_without_fortunes_indexes(tmp_path):
    (tmp_path / "b").write_bytes(b"second")
    (tmp_path / "a").write_bytes(b"first ")
    (tmp_path / "a.dat").write_bytes(b"\x00index")
    (tmp_path / "a.u8").symlink_to(tmp_path / "a")
    assert read_corpus(tmp_path) == b"first second"


def test_missing_or_tiny_text_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"data.path={tmp_path}/none does not exist; point data.path"):
        read_corpus(tmp_path / "none")
    (tmp_path / "t.txt").write_bytes(b"short")
    with pytest.raises(ConfigError, match="holds 5 bytes: too few for a validation sample"):
        text_corpus(str(tmp_path / "t.txt"), block_size=64)
