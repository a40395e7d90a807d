"""An outer gradient on its way (DiLoCo's sync.overlap and fragments): what was sent, when, and what waits for it."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ddp_lab.collectives.quantized import Residual


class InFlight(NamedTuple):
    """sync.overlap: an outer gradient's all-reduce on its way (work and wire None: resumed, not resent yet)."""
    work: object
    wire: torch.Tensor | None  # reduced in place: the mean once the work is done
    outer_grad: torch.Tensor  # what this rank sent (checkpointed)
    step: int  # when it was sent
    proxy: torch.Tensor | None = None  # sync.overlap_update=eager: the anchor the proxy step gave (checkpointed)
    before: Residual | None = None  # sync.rounding=feedback: the residuals before this send (checkpointed, resent)


class _Landed:
    """An exchange already waited for (an evaluation waited for it before it landed)."""

    @staticmethod
    def wait() -> None:
        pass

    @staticmethod
    def advance() -> None:
        pass


LANDED = _Landed()
