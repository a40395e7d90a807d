"""sync=fsdp sync.algo=direct: FSDP2's gradient reduce-scatter through ddp_lab's direct collective.

gloo has no reduce-scatter of its own: torch's gloo backend all-reduces the whole buffer and keeps this
rank's chunk, so each rank sends twice a reduce-scatter's bytes. collectives/direct.py sends each chunk
straight to the rank that owns it, (n-1)/n of the buffer, and posts its receives first (docs/communication.md).
FSDP2 takes it through `set_custom_reduce_scatter` (torch >= 2.9), on every unit; it calls it with the padded
flat gradients of a unit and waits at once (its reduce-scatter is synchronous on CPU). The all-gather stays
torch's: FSDP2 waits only for a torch Work, and gloo's all-gather sends no more than a gather needs.

With sync.overlap the call returns with the messages still travelling: FSDP2 has already cut the unit's sharded
gradients as views of the output, which is filled when the call is finished, by a later call (at most `in_flight`
left travelling) or by drain() at the backward's end. It holds only where FSDP2 neither reads nor divides the output
before the optimizer does: no HSDP all-reduce after it, no pre-/post-divide, no cast (fsdp.py asks for it there only).
"""
from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist

from ddp_lab.collectives.direct import direct_reduce_scatter
from ddp_lab.config import ConfigError


def custom_reduce_scatter(backend: str, in_flight: int = 0):
    """A ReduceScatter (FSDP2's interface) running direct_reduce_scatter, or a one-line refusal: off gloo (NCCL has
    a reduce-scatter of its own), or on a torch without FSDP2's custom comms. in_flight: how many calls may be left
    travelling (0: each finished before it returns)."""
    if backend != "gloo":
        raise ConfigError(f"sync=fsdp sync.algo=direct stands in for gloo's reduce-scatter (an all-reduce); {backend} "
                          f"has its own: leave sync.algo=builtin")
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:
        raise ConfigError(f"sync=fsdp sync.algo=direct needs FSDP2's custom reduce-scatter (torch >= 2.9); this "
                          f"torch is {torch.__version__}: leave sync.algo=builtin, or use sync=zero") from None

    class DirectReduceScatter(ReduceScatter):
        def __init__(self):
            self.travelling = deque()  # (the calls left under way, oldest first: each fills its output when called)
            self.returned_travelling = 0  # calls that returned with their messages under way (for the tests)

        def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            return torch.empty(size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                     op, async_op: bool = False) -> None:
            if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # (PREMUL_SUM: a divide factor ddp_lab never sets)
                raise ValueError(f"sync.algo=direct sums or averages; FSDP2 asked for {op}")
            # (the input is FSDP2's scratch buffer: summed in place, rank r's chunk is the result)
            pending = direct_reduce_scatter(input_tensor, group, async_op=True)

            def fill() -> None:
                output_tensor.copy_(pending.wait())
                if op == dist.ReduceOp.AVG:
                    output_tensor.div_(dist.get_world_size(group))
            self.travelling.append(fill)
            while len(self.travelling) > in_flight:
                self.travelling.popleft()()
            self.returned_travelling += len(self.travelling) > 0

        def drain(self) -> None:
            """Every call's output filled (the gradients ready for clipping and the optimizer)."""
            while self.travelling:
                self.travelling.popleft()()

    return DirectReduceScatter()
