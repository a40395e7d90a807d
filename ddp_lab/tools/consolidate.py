"""Any checkpoint's weights as one safetensors file, or a directory transformers' from_pretrained loads,
offline, in one process, a tensor at a time (DeepSpeed's zero_to_fp32, DCP's dcp_to_torch_save).

    python -m ddp_lab.tools.consolidate runs/my_run              (its newest checkpoint -> runs/my_run/consolidated/)
    python -m ddp_lab.tools.consolidate runs/my_run/checkpoints/step-00000200 --out /tmp/weights.safetensors

Every sync mode's checkpoint, at any world size: the weights whole in state.pt (ddp, zero stages 1 and 2, local
SGD and DiLoCo: rank 0's), or cut over the ranks' files (zero stage 3: each unit's flat pieces, joined and cut
into its parameters by the layout the checkpoint records; fsdp: each parameter's rows). Where one copy is cut
over an island's ranks (sync.inner=zero, HSDP), island 0's are read. The files are mapped, not read whole:
what the process holds at once is one unit (zero stage 3) or one tensor, and the output is written as the
tensors come (training/safetensors_file.py). A directory gets model.safetensors and, for a transformers model
(model=hf), its config.json: from_pretrained loads it (above --max-shard-mb, files of at most that and their
index, as save_pretrained writes them). Nothing is written over: an existing output is refused.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddp_lab.checkpoint.files import STATE, newest
from ddp_lab.checkpoint.whole_state import CheckpointWeights
from ddp_lab.config import ConfigError
from ddp_lab.training.safetensors_file import SafetensorsFile, SafetensorsShards, layout_bytes


def checkpoint_dir(path: Path) -> Path:
    """`path` if it is a checkpoint, else the newest intact one under it (a run directory, or its checkpoints/)."""
    path = Path(path)
    if (path / STATE).is_file():
        return path
    for root in (path / "checkpoints", path):
        if root.is_dir() and (found := newest(root)) is not None:
            return found
    raise ConfigError(f"{path} is neither a checkpoint nor a run directory holding one: point at a run directory "
                      f"or one of its checkpoints/step-* folders")


def consolidate(path: Path, out: Path | None = None, max_shard_mb: int = 50_000) -> Path:
    """The weights of the checkpoint at (or newest under) `path` written to `out` (a .safetensors file, or a
    directory: model.safetensors, and config.json for a transformers model, its weights in files of at most
    `max_shard_mb` MB above that); `out`'s path."""
    step_dir = checkpoint_dir(path)
    out = Path(out) if out is not None else (step_dir.parents[1] if step_dir.parent.name == "checkpoints"
                                             else step_dir.parent) / "consolidated"
    if out.exists():
        raise ConfigError(f"{out} exists: name another --out (nothing is written over)")
    weights = CheckpointWeights(step_dir)
    file = out if out.suffix == ".safetensors" else out / "model.safetensors"
    file.parent.mkdir(parents=True, exist_ok=True)
    model = weights.meta.get("config", {}).get("model", {})
    hf = file.parent == out and {"config", "head"} <= set(model)  # (model=hf's keys: its _target_ is not recorded)
    metadata, most = {"step": str(weights.meta["step"])}, max_shard_mb * 10**6
    writer = (SafetensorsShards(out, weights.layout, most, metadata) if hf and layout_bytes(weights.layout) > most
              else SafetensorsFile(file, weights.layout, metadata))
    try:
        for name, t in weights.tensors():
            writer.put(name, t)
        writer.finish()
    finally:
        writer.close()
    if hf:
        from ddp_lab.models.hf import load_config
        load_config(model["config"], model.get("overrides")).save_pretrained(str(out))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_lab.tools.consolidate", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a run directory (its newest checkpoint) or a checkpoint folder")
    parser.add_argument("--out", type=Path, default=None,
                        help="a .safetensors file, or a directory (default: <run>/consolidated/)")
    parser.add_argument("--max-shard-mb", type=int, default=50_000,
                        help="a transformers model's directory: its weights in files of at most this many MB "
                             "(10^6 bytes) above it, with their index (save_pretrained's 50GB)")
    args = parser.parse_args(argv)
    try:
        out = consolidate(args.path, args.out, args.max_shard_mb)
    except ConfigError as e:
        print(f"ddp_lab: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
