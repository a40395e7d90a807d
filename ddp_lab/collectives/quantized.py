"""The mean of a float buffer over the ranks, sent in 8 or 4 bits and summed in fp32.

What DiLoCo's outer gradients travel in under sync.compress=int8|int4 (Streaming DiLoCo,
Douillard et al. 2025, sends them in 4 bits). Each block of BLOCK numbers is scaled by its
largest magnitude and rounded to the nearest of 2^(bits-1)-1 levels either side of zero
(int4: two numbers a byte); its scale travels beside it in fp32. 4.5 bits a number in int4,
8.5 in int8: 7.1 and 3.8 times fewer than fp32.

Quantized numbers with different scales cannot be added on the wire, so an all-reduce
cannot sum them. Instead the buffer is cut into n chunks, and:

1. all-to-all: rank r sends its quantized chunk j to rank j (the reduce-scatter's traffic);
2. rank r dequantizes the n pieces of chunk r and sums them in fp32, divided by n;
3. all-gather: rank r quantizes its mean chunk and every rank receives every chunk.

Every rank sends 2(n-1)/n of the quantized bytes, a ring all-reduce's pattern, where
gathering every rank's whole quantized buffer would send n-1 times them. The mean is
quantized twice (each rank's piece, then the sum), each time to within half a level of
its block's scale, and every rank ends with the same numbers, bit for bit (they all
dequantize the same bytes). The two collectives are torch's (gloo and NCCL both have them), not ours.

How numbers round to their levels (sync.rounding):
* nearest: to the nearest level. In a block with an outlier the small numbers round to zero
  every time: a bias that never averages out over rounds.
* feedback: to the nearest, and what rounding left out is kept (a Residual, per rank) and added
  to the next round's numbers before they round (error feedback, as PowerSGD and DeMo keep
  theirs): over many rounds the sum of what arrives follows the sum of the true means, off by
  one round's error at most.
* stochastic: up or down at random, with the probabilities that make the expectation exact
  (unbiased, no state; the noise drawn from a generator the caller seeds, so a resumed run
  draws the same).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_lab.collectives.basics import TORCH_ALL_GATHER, Pending

BLOCK = 64  # numbers sharing one scale
BITS = {"int8": 8, "int4": 4}


class Residual:
    """Error feedback's memory on one rank (sync.rounding=feedback): what rounding left out of the pieces
    it sent (`sent`) and of the mean chunk it gathered out (`mean`), each added to the next round's."""

    def __init__(self, sent: torch.Tensor | None = None, mean: torch.Tensor | None = None):
        self.sent, self.mean = sent, mean

    @staticmethod
    def added(x: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
        return x if kept is None or kept.numel() != x.numel() else x + kept


def quantize(x: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of x (1-D float, a multiple of BLOCK long): codes as uint8, two a byte in
    int4; scales in fp32, one a block, each its block's largest magnitude over the top level.
    Rounded to nearest, or stochastically with noise from `generator`."""
    top = 2 ** (bits - 1) - 1  # 127 or 7 levels each side of zero
    blocks = x.float().view(-1, BLOCK)
    scales = blocks.abs().amax(dim=1) / top
    scaled = blocks / torch.where(scales > 0, scales, 1.0)[:, None]
    if generator is None:
        q = torch.round(scaled).clamp_(-top, top)
    else:  # floor(v + u), u uniform in [0, 1): up with probability v - floor(v), so E[q] = v
        q = torch.floor(scaled + torch.rand(scaled.shape, generator=generator)).clamp_(-top, top)
    codes = (q + top + 1).to(torch.uint8).view(-1)  # 1 .. 2 top + 1: never negative
    if bits == 4:
        codes = codes[0::2] << 4 | codes[1::2]
    return codes, scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    top = 2 ** (bits - 1) - 1
    if bits == 4:
        codes = torch.stack([codes >> 4, codes & 15], dim=1).view(-1)
    q = codes.to(torch.float32) - (top + 1)
    return (q.view(-1, BLOCK) * scales[:, None]).view(-1)


def _pack(x: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """One message: x's codes, then its scales' bytes."""
    codes, scales = quantize(x, bits, generator)
    return torch.cat([codes, scales.view(torch.uint8)])


def _unpack(msg: torch.Tensor, numel: int, bits: int) -> torch.Tensor:
    ncodes = numel * bits // 8
    scales = msg[ncodes:].clone().view(torch.float32)  # (a copy: the bytes of a view may be unaligned)
    return dequantize(msg[:ncodes], scales, bits)


def message_bytes(numel: int, bits: int) -> int:
    """Bytes of one quantized chunk of `numel` numbers (a multiple of BLOCK)."""
    return numel * bits // 8 + numel // BLOCK * 4


def quantized_mean_(flat: torch.Tensor, compress: str, group: dist.ProcessGroup | None = None) -> int:
    """flat (1-D float) <- the mean of every rank's flat, sent in BITS[compress] bits; the bytes of the
    whole quantized buffer (what an all-reduce of it would be counted as: summary.json's convention)."""
    pending, sent = start_quantized_mean(flat, compress, group)
    pending.wait()
    return sent


class QuantizedMeanUnderWay:
    """start_quantized_mean's call: its all-to-all under way, then its all-gather. advance() waits for the
    all-to-all, sums and starts the all-gather in the background; wait() finishes both. Every rank must
    advance at the same point (collectives go in the same order on every rank)."""

    def __init__(self, first: Pending):
        self.first, self.second = first, None

    def advance(self) -> None:
        if self.second is None:
            self.second = self.first.wait()

    def wait(self) -> torch.Tensor:
        self.advance()
        return self.second.wait()


def start_quantized_mean(flat: torch.Tensor, compress: str, group: dist.ProcessGroup | None = None,
                         residual: Residual | None = None, generator: torch.Generator | None = None):
    """quantized_mean_ with its all-to-all under way when it returns: (a QuantizedMeanUnderWay whose
    wait() finishes it and leaves the mean in flat; the bytes). What DiLoCo's sync.overlap sends,
    advancing it halfway; flat must not change until the wait. `residual`: error feedback (updated in
    place); `generator`: stochastic rounding's noise (else to nearest)."""
    bits, n = BITS[compress], dist.get_world_size(group)
    chunk = -(-flat.numel() // (n * BLOCK)) * BLOCK  # each rank's chunk, whole blocks
    padded = torch.zeros(n * chunk, dtype=torch.float32, device=flat.device)
    padded[:flat.numel()] = flat
    if residual is not None:
        padded = Residual.added(padded, residual.sent)
    mine = padded.view(n, chunk)
    send = torch.stack([_pack(mine[j], bits, generator) for j in range(n)])  # row j: for rank j
    if residual is not None:  # what the others will read of my pieces, and what it leaves out
        residual.sent = padded - torch.cat([_unpack(send[j], chunk, bits) for j in range(n)])
    recv = torch.empty_like(send)
    work = dist.all_to_all_single(recv, send, group=group, async_op=True)  # row j: rank j's piece of my chunk

    def gather() -> Pending:
        mean = sum(_unpack(recv[j], chunk, bits) for j in range(n)) / n  # summed in fp32
        if residual is not None:
            mean = Residual.added(mean, residual.mean)
        packed = _pack(mean, bits, generator)
        if residual is not None:
            residual.mean = mean - _unpack(packed, chunk, bits)
        gathered = torch.empty_like(send)
        done = TORCH_ALL_GATHER(gathered.view(-1), packed, group=group, async_op=True)

        def unpack() -> torch.Tensor:
            whole = torch.cat([_unpack(gathered[j], chunk, bits) for j in range(n)])
            return flat.copy_(whole[:flat.numel()])
        return Pending([done], unpack)

    return QuantizedMeanUnderWay(Pending([work], gather)), n * message_bytes(chunk, bits)
