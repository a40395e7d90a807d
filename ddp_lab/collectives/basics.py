"""What every hand-written all-reduce needs, textbook or tuned: the input
checks, the chunk boundaries every rank agrees on, a collective left under
way (Pending), and, for the textbook ones, where the data travels from and a
two-way exchange.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def check_tensor(tensor: torch.Tensor) -> None:
    """Reject inputs the algorithms would get silently wrong."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"all-reduce of a {str(tensor.dtype).replace('torch.', '')} tensor is not "
            f"supported; supported dtypes: {names}"
        )
    if not tensor.is_contiguous():
        raise ValueError(
            f"tensor of shape {tuple(tensor.shape)} with strides {tuple(tensor.stride())} "
            "is not contiguous; call .contiguous() first (and copy the result back "
            "into the original if you need it there)"
        )


def group_rank(group: dist.ProcessGroup | None) -> int:
    """This process's rank in `group`; ValueError outside it."""
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given group")
    return rank


def stages_through_host(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> bool:
    """A CUDA tensor on gloo: gloo's send/recv only handle CPU tensors."""
    return tensor.device.type == "cuda" and "nccl" not in str(dist.get_backend(group)).lower()


# torch's own reduce-scatter and all-gather, by their newer names where this torch has them
# (the older names warn there): what sync=zero and the benchmark call `builtin`
TORCH_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
TORCH_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Pending:
    """A collective under way (async_op=True): works posted and not yet waited for. wait() waits
    for them all, then finishes the call (adds what arrived, copies a staged tensor back) and
    returns what the call returns; a second wait() returns the same at once."""

    def __init__(self, works: list, finish: Callable[[], torch.Tensor]):
        self.works, self.finish, self.result = works, finish, None

    def wait(self) -> torch.Tensor:
        if self.finish is not None:
            for work in self.works:
                work.wait()
            self.result, self.finish, self.works = self.finish(), None, []
        return self.result


def chunk_bounds(numel: int, parts: int) -> list[int]:
    """Boundaries of `parts` near-equal pieces of range(numel): parts+1 ints.

    The first numel % parts pieces get one extra element; when numel < parts
    the trailing pieces are empty. Every rank computes the same list, so the
    two sides of a message always agree on its size.
    """
    base, extra = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def run_textbook(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    algorithm: Callable[[torch.Tensor, int, int, dist.ProcessGroup | None], None],
) -> torch.Tensor:
    """Check the input, then `algorithm(flat, rank, size, group)` on a 1-D view
    of it (or on a host copy: a CUDA tensor on gloo), and return the tensor."""
    check_tensor(tensor)
    rank, size = group_rank(group), dist.get_world_size(group)
    if size == 1 or tensor.numel() == 0:  # every rank knows: nothing to send
        return tensor
    flat = tensor.detach().view(-1)  # gradients require grad; summing them is not part of a graph
    if stages_through_host(tensor, group):
        host = flat.cpu()
        algorithm(host, rank, size, group)
        flat.copy_(host)
    else:
        algorithm(flat, rank, size, group)
    return tensor


def sendrecv(send: torch.Tensor, to: int, recv: torch.Tensor, source: int,
             group: dist.ProcessGroup | None) -> None:
    """Send `send` to group rank `to` while receiving into `recv` from group
    rank `source`, and wait for both.

    Both are posted as one batch: on NCCL, ranks that each post a send before
    their receive can all wait for each other forever.
    """
    ops = [dist.P2POp(dist.isend, send, group=group, group_peer=to),
           dist.P2POp(dist.irecv, recv, group=group, group_peer=source)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
