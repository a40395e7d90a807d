"""A small GPT: a decoder-only transformer, in the spirit of nanoGPT.

    tokens (B, T) -> token + position embeddings -> n_layer x Block -> LayerNorm -> logits (B, T, vocab)
    Block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))   (pre-norm residual)

Attention is causal (a position sees only the ones before it) through torch's
scaled_dot_product_attention; the output layer shares its weights with the
token embedding (GPT-2's weight tying). Presets: conf/model/gpt*.yaml.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.config import ConfigError


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> three (B, heads, T, C / heads)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = MLP(n_embd, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix reads and writes tokens
        self.n_layer = n_layer
        self.apply(self.init_weights)

    def init_weights(self, m: nn.Module) -> None:
        """GPT-2's init of one module, applied to every module in post-order (the constructor's last
        line): N(0, 0.02) weights, zero biases, the residual projections scaled down by depth. One
        module at a time, so that a meta-device build replays it a unit at a time (models/meta_init.py)."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, (CausalSelfAttention, MLP)):  # (after its layers: post-order)
            nn.init.normal_(m.proj.weight, std=0.02 / math.sqrt(2 * self.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.block_size:
            raise ValueError(f"a sequence of {T} tokens is longer than the model's block_size of "
                             f"{self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(vocab_size: int = 256, block_size: int = 64, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
        dropout: float = 0.0) -> GPT:
    if n_embd % n_head:
        raise ConfigError(f"model.n_embd={n_embd} must be a multiple of model.n_head={n_head}: each head "
                          f"takes n_embd / n_head dimensions")
    return GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout)
