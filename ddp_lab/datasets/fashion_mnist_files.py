"""Fashion-MNIST's four files: find them, check them, unpack them once into a cache.

Where they are looked for, in order: `data.root` (the four .gz files, or a
torchvision root with FashionMNIST/raw/), the Debian package's folder
(`apt-get install dataset-fashion-mnist`), torchvision's download
(`data.download=true`).

The files are read as IDX (`read_idx`); gzipped ones are first unpacked into
`data.cache_dir`, into a folder named after the source folder and its
files' sizes and times: another data.root, or a changed file, never reads a
stale copy. Each file is unpacked under a temporary name, checked (its IDX
header must match its size), and only then renamed into place; on any
failure the temporary is removed and the error names the file, what is
wrong with it and how to get a good copy.
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import shutil
import struct
import zlib
from pathlib import Path

import torch

from ddp_lab.config import ConfigError

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_MAGIC = {1: 0x0801, 3: 0x0803}  # unsigned bytes, 1-D (labels) or 3-D (images)


def _has_raw(folder: Path, suffix: str) -> bool:
    return all((folder / (f + suffix)).is_file() for f in RAW_FILES)


def _gz_folder(src: Path) -> Path | None:
    """Where the four gzipped IDX files are: src itself or torchvision's layout."""
    for folder in (src, src / "FashionMNIST" / "raw"):
        if _has_raw(folder, ".gz"):
            return folder
    return None


def idx_problem(path: Path) -> str | None:
    """What is wrong with an unpacked IDX file of unsigned bytes, or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 8:
        return f"it holds only {size} bytes, less than an IDX header"
    magic, n = struct.unpack(">II", head[:8])
    dims = magic & 0xFF
    if dims not in IDX_MAGIC or magic != IDX_MAGIC[dims]:
        return f"it is not an IDX file of bytes (magic number 0x{magic:08x})"
    shape = [n, *struct.unpack(f">{dims - 1}I", head[8:4 * (dims + 1)])] if dims > 1 else [n]
    expected = 4 * (dims + 1) + math.prod(shape)  # the header, then one byte per value
    if size != expected:
        return (f"its header promises {' x '.join(map(str, shape))} bytes of data "
                f"({expected} bytes in all) but it holds {size}: cut short or padded")
    return None


def read_idx(path: Path) -> torch.Tensor:
    """An unpacked IDX file of unsigned bytes as a uint8 tensor of its shape."""
    why = idx_problem(path)
    if why is not None:
        raise ConfigError(f"{path} is damaged: {why}; replace it with a good copy "
                          "(or point data.root at the .gz files)")
    data = path.read_bytes()
    dims = data[3]
    shape = struct.unpack(f">{dims}I", data[4:4 * (dims + 1)])
    return torch.frombuffer(bytearray(data[4 * (dims + 1):]), dtype=torch.uint8).view(*shape)


def _how_to_fix(gz: Path) -> str:
    if gz.parent == DEBIAN_DIR:
        return "reinstall it: apt-get install --reinstall dataset-fashion-mnist"
    return ("replace it with a good copy (the Debian package dataset-fashion-mnist has them, "
            "or data.download=true fetches them)")


def _unpack(gz: Path, target: Path) -> None:
    """gz -> target, checked; a damaged source names itself and leaves nothing behind."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        try:
            with gzip.open(gz, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except EOFError:
            why = "it is cut short (the compressed data ends before its end marker)"
        except gzip.BadGzipFile:
            why = "it is not a gzip file"
        except zlib.error as e:
            why = f"its compressed data is corrupt ({e})"
        else:
            why = idx_problem(tmp)
        if why is not None:
            raise ConfigError(f"{gz} is damaged: {why}; {_how_to_fix(gz)}")
        # Several ranks may get here at once: each writes its own temp file and
        # renames it into place, so no reader ever sees half a file.
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _unpack_into_cache(gz_folder: Path, cache: Path) -> Path:
    """A torchvision root (<root>/FashionMNIST/raw/) holding gz_folder's files unpacked."""
    stamp = [str(gz_folder.resolve())]
    for name in RAW_FILES:
        st = (gz_folder / (name + ".gz")).stat()
        stamp.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    cache_root = cache / ("fashion-mnist-" + hashlib.sha1("|".join(stamp).encode()).hexdigest()[:12])
    raw = cache_root / "FashionMNIST" / "raw"
    try:
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"data.cache_dir={cache} is not usable ({e.strerror}); point "
                          "data.cache_dir at a writable folder") from None
    for name in RAW_FILES:
        target = raw / name
        # A copy damaged after it was made (a full disk, a crash) is unpacked again.
        if not target.is_file() or idx_problem(target) is not None:
            _unpack(gz_folder / (name + ".gz"), target)
    return cache_root


def _check_unpacked(raw: Path) -> None:
    for name in RAW_FILES:
        why = idx_problem(raw / name)
        if why is not None:
            raise ConfigError(f"{raw / name} is damaged: {why}; replace it with a good copy "
                              "(or point data.root at the .gz files)")


def locate_fashion_mnist(root: str | None, download: bool, cache_dir: str) -> Path:
    """A root that torchvision's FashionMNIST reads, or a ConfigError saying how to get one."""
    cache = Path(cache_dir).expanduser()
    if root is not None:
        src = Path(root).expanduser()
        if _has_raw(src / "FashionMNIST" / "raw", ""):
            _check_unpacked(src / "FashionMNIST" / "raw")
            return src
        gz = _gz_folder(src)
        if gz is not None:
            return _unpack_into_cache(gz, cache)
        if download:
            return src
        raise ConfigError(
            f"data.root={root}: no Fashion-MNIST files there (looked for {', '.join(RAW_FILES)} "
            f"(.gz or not) in {src} and {src / 'FashionMNIST' / 'raw'}); point data.root at them, "
            "or add data.download=true to fetch them with torchvision"
        )
    if _has_raw(DEBIAN_DIR, ".gz"):
        return _unpack_into_cache(DEBIAN_DIR, cache)
    if download:
        return cache / "fashion-mnist"
    raise ConfigError(
        f"Fashion-MNIST not found: data.root is not set and {DEBIAN_DIR} does not exist. "
        "Either install it (`apt-get install dataset-fashion-mnist`), or pass "
        "data.root=<folder with the four .gz files>, or add data.download=true"
    )
