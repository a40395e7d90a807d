"""sync.fragments=F (Streaming DiLoCo's fragments): which runs of the parameters synchronise together."""
from __future__ import annotations

from ddp_lab.config import ConfigError


def fragment_bounds(sizes: list[int], fragments: int) -> list[tuple[int, int]]:
    """[lo, hi) runs of the parameters (their element counts `sizes`, in order) cut into `fragments` of about
    equal size: fragment f begins at the first parameter where the running total reaches f/F of the whole
    (or where the parameters left are just enough for one each)."""
    if fragments > len(sizes):
        raise ConfigError(f"sync.fragments={fragments} is more than the model's {len(sizes)} trainable parameter "
                          f"tensors: use at most {len(sizes)}")
    total, cuts = sum(sizes), [0]
    for i in range(1, len(sizes)):
        left = fragments - len(cuts)
        if left and (sum(sizes[:i]) >= len(cuts) * total / fragments or len(sizes) - i == left):
            cuts.append(i)
    return list(zip(cuts, cuts[1:] + [len(sizes)]))
