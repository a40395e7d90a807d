"""Plain text as bytes, for next-token prediction.

The corpus is read as bytes (a vocabulary of 256, no tokenizer to install),
split into a training part and the last `val_fraction` for validation, and
cut into non-overlapping samples of `block_size` tokens; each sample's target
is the same window shifted by one token. The default corpus is Debian's
`fortunes` package: 2.5 MB of plain text under a BSD licence, installed
offline by `apt-get install fortunes` (`make data`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ddp_lab.config import ConfigError
from ddp_lab.datasets.pairs import TensorPairs

FORTUNES = Path("/usr/share/games/fortunes")


def read_corpus(path: str | Path) -> bytes:
    """A file's bytes, or a folder's text files' (by name; fortune's .dat indexes and links skipped)."""
    path = Path(path).expanduser()
    if path.is_file():
        return path.read_bytes()
    if not path.is_dir():
        fix = " (install it: apt-get install fortunes, or make data)" if path == FORTUNES else ""
        raise ConfigError(f"data.path={path} does not exist{fix}; point data.path at a plain-text "
                          f"file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.is_symlink() and p.suffix != ".dat")
    return b"".join(p.read_bytes() for p in files)


def windows(tokens: torch.Tensor, block_size: int) -> TensorPairs:
    """Non-overlapping (block_size tokens, the next block_size tokens) samples."""
    n = (len(tokens) - 1) // block_size
    x = tokens[:n * block_size].view(n, block_size)
    y = tokens[1:n * block_size + 1].view(n, block_size)
    return TensorPairs(x, y)


def text_corpus(path: str = str(FORTUNES), block_size: int = 64,
                val_fraction: float = 0.1) -> tuple[TensorPairs, TensorPairs]:
    """(train, validation) samples of `block_size` byte tokens from the text at `path`."""
    raw = read_corpus(path)
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - val_fraction))
    train, val = windows(tokens[:cut], block_size), windows(tokens[cut:], block_size)
    if len(val) == 0:
        raise ConfigError(f"data.path={path} holds {len(raw):,} bytes: too few for a validation sample of "
                          f"data.block_size={block_size} tokens; use more text or a smaller block_size")
    return train, val
