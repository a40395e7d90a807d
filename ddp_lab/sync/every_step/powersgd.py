"""sync.compress=powersgd: torch's PowerSGD hook under DDP, its bytes counted, its state checkpointed.

PowerSGD (Vogels et al., NeurIPS 2019) sends each gradient matrix M (n x m,
a conv kernel viewed as out x in*k*k) as two thin factors: P = M Q (n x r),
all-reduced and orthogonalised, then Q = M^T P (m x r), all-reduced; every
rank decompresses P Q^T. (n + m) r numbers travel instead of n m. What the
approximation leaves out is added to the next step's gradient (error
feedback), and Q starts from the last step's (warm start). Vectors (biases)
and matrices too small to pay are all-reduced as they are. The first
`sync.powersgd_start_step` steps are plain all-reduces.

The hook is torch's (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook):
the well-kept implementation. This file adds four things around it:

* bytes: the hook's own count of the numbers it hands to all-reduce
  (PowerSGDState.total_numel_after_compression), read at every call;
* state: the error feedback differs per rank (own_state_dict), the P and Q
  memories and the iteration count are the same on every rank (state_dict);
* order: under gloo each bucket's exchange finishes before the next bucket's
  starts (see __init__); NCCL orders them by issue, as torch's hook expects;
* layout: torch keeps that state per DDP bucket, laid out in the bucket's
  order of parameters, and a resumed process's DDP lays out its first step's
  buckets before it learns the backward's order (torch's hook alone avoids
  this only by its plain first steps). So each bucket's order is kept, and
  when a bucket comes in another order its state is moved parameter by
  parameter (`_relayout`): the resumed run continues bit for bit.
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

# torch's hook logs its configuration and every allocation at INFO, and each
# state save/load at WARNING ("process group is not serializable"): we save
# our own fields, so keep its logger to errors.
logging.getLogger(torch_powersgd.__name__).setLevel(logging.ERROR)


class PowerSGD:
    """A DDP communication hook (`hook`) with the state around torch's PowerSGD."""

    def __init__(self, cfg, params: list[torch.nn.Parameter], count, wait: bool):
        self.state = torch_powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start_step, use_error_feedback=True, warm_start=True,
            random_seed=0)
        self.count = count  # called with the bytes a bucket hands to all-reduces, and how many
        # gloo: the hook's next all-reduces (P, then Q) are issued from the callback of the last
        # one, on gloo's thread, while backward issues the next bucket's: ranks could issue them
        # in different orders and pair mismatched all-reduces. So each bucket finishes first.
        self.wait = wait
        self.index = {p.data_ptr(): i for i, p in enumerate(params)}  # a parameter's number
        self.shapes = [p.shape for p in params]
        self.orders: dict[int, list[int]] = {}  # bucket -> its parameters' numbers, as its state is laid out

    def hook(self, state, bucket):
        s, idx = self.state, bucket.index()
        order = [self.index[p.data_ptr()] for p in bucket.parameters()]
        if self.orders.get(idx, order) != order:
            self._relayout(idx, self.orders[idx], order)
        self.orders[idx] = order
        size = bucket.buffer().element_size()
        if s.iter < s.start_powerSGD_iter:  # a plain all-reduce of the bucket
            self.count(bucket.buffer().numel() * size, 1)
            return torch_powersgd.powerSGD_hook(s, bucket)
        before = s.total_numel_after_compression
        fut = torch_powersgd.powerSGD_hook(s, bucket)
        # three all-reduces a bucket: its uncompressed (1-D) tensors, then P, then Q
        self.count((s.total_numel_after_compression - before) * size, 3)
        if self.wait:
            fut.wait()
        return fut

    # ------------------------------------------------------------ layout
    def _pieces(self, order: list[int]) -> dict[str, dict[int, int]]:
        """How long each parameter's piece is in a bucket of `order`, in torch's layout: the
        error feedback holds every parameter; P and Q only the compressed matrices, grouped
        by shape (first seen first), n r and m r numbers each."""
        pieces: dict[str, dict[int, int]] = {"error": {}, "p": {}, "q": {}}
        groups: dict[tuple, list[tuple[int, int, int]]] = {}
        for i in order:
            n = self.shapes[i][0] if len(self.shapes[i]) else 1
            m = self.shapes[i].numel() // n
            r = min(n, m, self.state.matrix_approximation_rank)
            pieces["error"][i] = n * m
            if torch_powersgd._should_compress(n, m, r, self.state.min_compression_rate)[0]:
                groups.setdefault((n, m), []).append((i, n * r, m * r))
        for members in groups.values():
            for i, p_len, q_len in members:
                pieces["p"][i], pieces["q"][i] = p_len, q_len
        return pieces

    def _relayout(self, idx: int, old: list[int], new: list[int]) -> None:
        """Bucket `idx` now holds its parameters in order `new`: lay its state out so."""
        before, after = self._pieces(old), self._pieces(new)
        s = self.state
        for what, memory in (("error", s.error_dict), ("p", s.p_memory_dict), ("q", s.q_memory_dict)):
            if idx not in memory:
                continue
            parts, offset = {}, 0
            for i, n in before[what].items():
                parts[i] = memory[idx][offset:offset + n]
                offset += n
            memory[idx] = torch.cat([parts[i] for i in after[what]])

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        s = self.state
        name, keys, pos, has_gauss, gauss = s.rng.get_state()
        return {"iter": s.iter, "orders": dict(self.orders),
                "p": dict(s.p_memory_dict), "q": dict(s.q_memory_dict),
                "rng": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                        "has_gauss": int(has_gauss), "gauss": float(gauss)},
                "numel": [s.total_numel_before_compression, s.total_numel_after_compression]}

    def own_state_dict(self) -> dict:
        """This rank's error feedback (laid out by the shared state's orders)."""
        return {"error": dict(self.state.error_dict)}

    def load_state_dict(self, shared: dict, own: dict | None) -> None:
        s = self.state
        s.iter = shared["iter"]
        r = shared["rng"]
        s.rng.set_state(("MT19937", r["keys"].numpy().astype(np.uint32), r["pos"], r["has_gauss"],
                         r["gauss"]))
        s.total_numel_before_compression, s.total_numel_after_compression = shared["numel"]
        self.orders = dict(shared["orders"])  # the first step's buckets may be laid out otherwise: hook()
        s.p_memory_dict, s.q_memory_dict = dict(shared["p"]), dict(shared["q"])
        # at another world size every rank starts without error feedback (docs/bandwidth.md)
        s.error_dict = dict(own["error"]) if own is not None else {}
