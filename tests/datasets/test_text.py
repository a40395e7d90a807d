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
    with pytest.raises(ConfigError) as e:
        text_corpus(str(tmp_path / "t.txt"), block_size=64)
    assert str(e.value) == (f"data.block_size=64 is longer than the training split's 4 tokens (the first 90% of "
                            f"data.path={tmp_path}/t.txt): lower the context (model.block_size, which "
                            f"data.block_size follows) to at most 3, or use more text")


def test_a_context_longer_than_a_split_names_the_split_and_its_length(tmp_path):
    (tmp_path / "a.txt").write_bytes(bytes(1000))  # 900 training tokens, 100 held out
    train, val = text_corpus(str(tmp_path / "a.txt"), block_size=99)  # exactly one held-out sample
    assert (len(train), len(val), train.tokens, val.tokens) == (9, 1, 900, 100)
    with pytest.raises(ConfigError) as e:
        text_corpus(str(tmp_path / "a.txt"), block_size=100)
    assert str(e.value) == (f"data.block_size=100 is longer than the validation split's 100 tokens (the last "
                            f"data.val_fraction=0.1 of data.path={tmp_path}/a.txt): lower the context "
                            f"(model.block_size, which data.block_size follows) to at most 99, or raise "
                            f"data.val_fraction, or use more text")
    with pytest.raises(ConfigError, match=r"data.block_size=950 is longer than the training split's 950 tokens \(the "
                                          r"first 95% of"):
        text_corpus(str(tmp_path / "a.txt"), block_size=950, val_fraction=0.05)
