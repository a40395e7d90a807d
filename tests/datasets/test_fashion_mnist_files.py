"""Finding Fashion-MNIST's files, unpacking them once, and refusing damaged ones in one line."""
import gzip
import shutil

import pytest

from ddp_lab.config import ConfigError
from ddp_lab.datasets.fashion_mnist_files import RAW_FILES, idx_problem, locate_fashion_mnist
from tests.conftest import make_tiny_fashion_mnist


def test_cache_is_keyed_by_source(tmp_path):
    a = make_tiny_fashion_mnist(tmp_path / "a", seed=1)
    b = make_tiny_fashion_mnist(tmp_path / "b", seed=2)
    ra = locate_fashion_mnist(str(a), False, str(tmp_path / "cache"))
    rb = locate_fashion_mnist(str(b), False, str(tmp_path / "cache"))
    assert ra != rb


def test_missing_data_names_the_path_and_both_fixes(tmp_path):
    with pytest.raises(ConfigError) as e:
        locate_fashion_mnist(str(tmp_path / "nowhere"), False, str(tmp_path))
    msg = str(e.value)
    assert "nowhere" in msg and "data.download=true" in msg and "data.root" in msg




def _leftovers(cache):
    return sorted(p.name for p in cache.rglob("*") if p.name.endswith(".tmp"))


def _copy(tiny_fmnist, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_fmnist, src)
    return src


def test_a_truncated_file_is_named_and_leaves_nothing_in_the_cache(tiny_fmnist, tmp_path):
    src = _copy(tiny_fmnist, tmp_path)
    gz = src / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(ConfigError) as e:
        locate_fashion_mnist(str(src), False, str(tmp_path / "cache"))
    assert str(e.value) == (
        f"{gz} is damaged: it is cut short (the compressed data ends before its end marker); "
        "replace it with a good copy (the Debian package dataset-fashion-mnist has them, or "
        "data.download=true fetches them)")
    assert _leftovers(tmp_path / "cache") == []
    assert not any(p.name == "train-images-idx3-ubyte" for p in (tmp_path / "cache").rglob("*"))


def test_not_gzip_and_a_header_that_lies_are_named(tiny_fmnist, tmp_path):
    src = _copy(tiny_fmnist, tmp_path)
    labels = src / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(b"this is not gzip data at all")
    with pytest.raises(ConfigError, match=f"{labels} is damaged: it is not a gzip file"):
        locate_fashion_mnist(str(src), False, str(tmp_path / "cache"))
    # a whole gzip stream whose IDX content is cut short: the header promises more
    images = src / "t10k-images-idx3-ubyte.gz"
    shutil.copy(tiny_fmnist / "t10k-labels-idx1-ubyte.gz", labels)
    data = gzip.decompress(images.read_bytes())
    images.write_bytes(gzip.compress(data[:-100]))
    with pytest.raises(ConfigError) as e:
        locate_fashion_mnist(str(src), False, str(tmp_path / "cache"))
    assert str(e.value).startswith(
        f"{images} is damaged: its header promises 203 x 28 x 28 bytes of data "
        f"({16 + 203 * 28 * 28} bytes in all) but it holds {16 + 203 * 28 * 28 - 100}: cut short")
    assert _leftovers(tmp_path / "cache") == []


def test_a_changed_source_is_unpacked_again(tiny_fmnist, tmp_path):
    src = _copy(tiny_fmnist, tmp_path)
    first = locate_fashion_mnist(str(src), False, str(tmp_path / "cache"))
    make_tiny_fashion_mnist(src, n_train=100, seed=3)  # new files in the same place
    second = locate_fashion_mnist(str(src), False, str(tmp_path / "cache"))
    assert second != first
    raw = second / "FashionMNIST" / "raw"
    assert (raw / "train-images-idx3-ubyte").stat().st_size == 16 + 100 * 28 * 28


def test_a_cached_copy_damaged_later_is_unpacked_again(tiny_fmnist, tmp_path):
    root = locate_fashion_mnist(str(tiny_fmnist), False, str(tmp_path / "cache"))
    cached = root / "FashionMNIST" / "raw" / "train-labels-idx1-ubyte"
    good = cached.read_bytes()
    cached.write_bytes(good[:20])
    assert idx_problem(cached) is not None
    assert locate_fashion_mnist(str(tiny_fmnist), False, str(tmp_path / "cache")) == root
    assert cached.read_bytes() == good


def test_unpacked_files_given_as_data_root_are_checked(tiny_fmnist, tmp_path):
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in RAW_FILES:
        (raw / name).write_bytes(gzip.decompress((tiny_fmnist / f"{name}.gz").read_bytes()))
    assert locate_fashion_mnist(str(tmp_path / "root"), False, str(tmp_path / "cache")) == tmp_path / "root"
    (raw / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01")
    with pytest.raises(ConfigError, match="train-labels-idx1-ubyte is damaged: it holds only 4 bytes"):
        locate_fashion_mnist(str(tmp_path / "root"), False, str(tmp_path / "cache"))
