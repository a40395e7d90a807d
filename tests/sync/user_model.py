"""A transformer written as a user writes one, for the sharded modes' tests: its blocks nested two deep
(`transformer.h`, a ModuleList in a ModuleDict), its output tied to the token embedding by `F.linear`, the
position embedding frozen (or a whole block: `frozen="block"`), LayerNorms, and dict batches."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.c_attn(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), Attention(d, heads), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class UserTransformer(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 16, n_layer: int = 3, heads: int = 2, block: int = 8,
                 frozen: str = "positions"):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
            h=nn.ModuleList(Layer(d, heads) for _ in range(n_layer)), ln_f=nn.LayerNorm(d)))
        frozen_part = {"positions": self.transformer.wpe, "block": self.transformer.h[0], "none": None}[frozen]
        if frozen_part is not None:
            frozen_part.requires_grad_(False)

    def forward(self, batch: dict | torch.Tensor) -> torch.Tensor:
        idx = batch["tokens"] if isinstance(batch, dict) else batch
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for layer in self.transformer.h:
            x = layer(x)
        return F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)  # tied, the common way


class ReadsAChild(nn.Module):
    """A parent that reads its child's parameter in its own forward (`self.a.bias`)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + self.a.bias)


def user_transformer(**kwargs) -> UserTransformer:
    """Built by `_target_` (model._target_=tests.sync.user_model.user_transformer)."""
    return UserTransformer(**kwargs)
