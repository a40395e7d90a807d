"""Plain text as bytes, for next-token prediction.

The corpus is read as bytes (a vocabulary of 256, no tokenizer to install),
split into a training part and the last `val_fraction` for validation, and
cut into non-overlapping samples of `block_size` tokens; each sample's target
is the same window shifted by one token. The default corpus is Debian's
`fortunes` package: 2.5 MB of plain text under a BSD licence, installed
offline by `apt-get install fortunes` (`make data`).

`text_documents` gives the same corpus as Hugging Face-style samples: one dict a
document (a fortune, cut at `%` lines), `input_ids` of its first block_size bytes,
`attention_mask` and `labels` (the ids again: a causal LM shifts them itself), of
different lengths, padded a batch at a time (ddp_lab.datasets.keyed.collate).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

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


class TokenWindows(TensorPairs):
    """Windows cut from one token sequence; `tokens`: that sequence's length, for the
    messages that say how long a context the split can supply (ddp_lab.training.data)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, tokens: int):
        super().__init__(inputs, targets)
        self.tokens = tokens


def windows(tokens: torch.Tensor, block_size: int) -> TokenWindows:
    """Non-overlapping (block_size tokens, the next block_size tokens) samples."""
    n = (len(tokens) - 1) // block_size
    x = tokens[:n * block_size].view(n, block_size)
    y = tokens[1:n * block_size + 1].view(n, block_size)
    return TokenWindows(x, y, len(tokens))


# data=text's block_size follows the model's context: that is the key a user sets
CONTEXT = "the context (model.block_size, which data.block_size follows)"


def check_holds_a_window(split: str, tokens: int, block_size: int, where: str, fix: str) -> None:
    """One sample takes block_size + 1 tokens (its target is shifted by one): refuse a
    context longer than the split, naming its length, rather than an empty split."""
    if tokens > block_size:
        return
    lower = f"lower {CONTEXT} to at most {tokens - 1}, or " if tokens > 1 else ""
    raise ConfigError(f"data.block_size={block_size} is longer than the {split} split's {tokens:,} tokens "
                      f"({where}): {lower}{fix}")


def text_corpus(path: str = str(FORTUNES), block_size: int = 64,
                val_fraction: float = 0.1) -> tuple[TensorPairs, TensorPairs]:
    """(train, validation) samples of `block_size` byte tokens from the text at `path`."""
    raw = read_corpus(path)
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - val_fraction))
    check_holds_a_window("training", cut, block_size, f"the first {1 - val_fraction:.0%} of data.path={path}",
                         "use more text")
    check_holds_a_window("validation", len(tokens) - cut, block_size,
                         f"the last data.val_fraction={val_fraction} of data.path={path}",
                         "raise data.val_fraction, or use more text")
    return windows(tokens[:cut], block_size), windows(tokens[cut:], block_size)


class Documents(Dataset):
    """Token sequences of different lengths as {input_ids, attention_mask, labels} dicts."""

    def __init__(self, docs: list[torch.Tensor]):
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict:
        ids = self.docs[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def text_documents(path: str = str(FORTUNES), block_size: int = 64, val_fraction: float = 0.1,
                   separator: str = "\n%\n") -> tuple[Documents, Documents]:
    """(train, validation) documents of the text at `path`, cut at `separator`, each its first block_size
    byte tokens (documents of fewer than 2 tokens dropped); the last val_fraction of them held out."""
    docs = [torch.tensor(list(d[:block_size]), dtype=torch.long)
            for d in read_corpus(path).split(separator.encode()) if len(d.strip()) >= 2]
    cut = int(len(docs) * (1 - val_fraction))
    if cut < 1 or cut == len(docs):
        raise ConfigError(f"data.path={path} holds {len(docs)} document(s) (cut at {separator!r}): too few for a "
                          f"training and a validation split; use more text or another data.val_fraction")
    return Documents(docs[:cut]), Documents(docs[cut:])
