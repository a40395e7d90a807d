"""Shared by the collectives' tests: inputs any rank can rebuild, and the rounding bound of a sum."""
import torch

# Unit roundoff u of each dtype. Summing n values in any order, each addition
# rounds once, so |result - exact| <= (n-1) * u * sum(|x_i|); the tests allow
# n * u * sum(|x_i|). float64 inputs are integer-valued, so any order is exact.
UNIT_ROUNDOFF = {
    torch.float64: 0.0,
    torch.float32: 2.0 ** -24,
    torch.float16: 2.0 ** -11,
    torch.bfloat16: 2.0 ** -8,
}


def rank_input(rank: int, shape, dtype: torch.dtype, case: int) -> torch.Tensor:
    """A different, reproducible input on every rank (any rank can rebuild any other's)."""
    g = torch.Generator().manual_seed(10_000 * case + rank)
    if dtype == torch.float64:
        return torch.randint(-1000, 1001, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def compare(what: str, out: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> str | None:
    """None if |out - expected| <= bound everywhere (float64 tensors), else why not."""
    err = (out.double() - expected).abs()
    if bool((err <= bound).all()):
        return None
    return f"{what}: max abs error {err.max().item():g} exceeds the rounding bound"
