"""Where, on what and from which code a measurement ran: record.json beside every result.

    from ddp_lab.telemetry.provenance import command_line, machine_facts, write_record

    write_record(out_dir, command_line("ddp_lab.tools.bench.scaling", argv), {"worlds": [1, 2]})

Every benchmark (`ddp_lab.tools.bench.collectives`, `.scaling`, `.vs_baseline`) and
the cost model write a record.json into their output folder, so a figure copied
out of it can be traced back to the machine and the code that produced it:

    date              when the record was written (UTC, ISO 8601): the end of the measurement
    machine           a short name for the machine (machine_short_name), e.g. zen5-2c, xeon-amx-2c
    command           how the measurement was launched, as one would type it again (null when
                      it was called from Python rather than from the command line)
    git_commit        the commit of the ddp_lab checkout that ran (null when ddp_lab is not
                      running from a git checkout, e.g. after a plain `pip install .`)
    git_dirty         whether tracked files outside docs/ differed from that commit, and
    git_dirty_files   which (the measured code is then not exactly the commit's)
    torch, torch_cpu_capability, python
    cpu_model, cpu_vendor, cpu_family, cpu_model_number
    cores             logical CPUs of the machine; cores_usable: those this process may run on
    cpu_flags         the instruction-set extensions that change which kernels run and how
                      fast: {avx2, avx512f, avx512_bf16, avx512_vnni, amx_tile, amx_bf16, amx_int8}
    cuda_devices      the GPUs torch sees (names), [] on a CPU-only machine
    env               thread-count and kernel-selection variables that were set (OMP_NUM_THREADS, ...)

plus whatever the benchmark adds (world size, backend, inputs, ...). A key
whose value could not be found is null, never guessed.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The x86 extensions that decide which kernels oneDNN, inductor and ATen pick
# (bf16 autocast is only on by default where avx512_bf16 or AMX run it natively).
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
# Environment variables that change thread counts or kernel choice, recorded when set.
ENV_OF_INTEREST = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                   "DNNL_MAX_CPU_ISA", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR")
RECORD_NAME = "record.json"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ddp_lab/


def cpu_facts(cpuinfo: str | None = None) -> dict:
    """The first processor's model, vendor, family, model number and flags of interest.

    cpuinfo: the text of /proc/cpuinfo (read here when None). Where there is no
    /proc/cpuinfo (not Linux), only platform.processor() is known and the rest is null.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags")
    present = set(flags.split()) if flags is not None else None
    return {
        "cpu_model": fields.get("model name") or platform.processor() or None,
        "cpu_vendor": fields.get("vendor_id"),
        "cpu_family": int(fields["cpu family"]) if fields.get("cpu family", "").isdigit() else None,
        "cpu_model_number": int(fields["model"]) if fields.get("model", "").isdigit() else None,
        "cpu_flags": None if present is None else {f: f in present for f in FLAGS_OF_INTEREST},
    }


def _cpu_generation(facts: dict) -> str:
    vendor, family = facts.get("cpu_vendor"), facts.get("cpu_family")
    model, flags = facts.get("cpu_model_number") or 0, facts.get("cpu_flags") or {}
    if vendor == "AuthenticAMD":
        # AMD family numbers: 0x17 Zen/Zen+ (models below 0x30) and Zen 2, 0x19 Zen 3 and
        # Zen 4 (the one with AVX-512), 0x1A Zen 5.
        if family == 23:
            return "zen1" if model < 0x30 else "zen2"
        if family == 25:
            return "zen4" if flags.get("avx512f") else "zen3"
        if family == 26:
            return "zen5"
        return "amd"
    if vendor == "GenuineIntel":
        name = "xeon" if "xeon" in (facts.get("cpu_model") or "").lower() else "intel"
        return name + ("-amx" if flags.get("amx_tile") else "")
    if platform.machine() in ("aarch64", "arm64"):
        return "arm"
    return "cpu"


def machine_short_name(facts: dict) -> str:
    """e.g. zen1-2c, zen5-2c, xeon-amx-2c, or zen4-16c-h100x1 with one H100."""
    name = f"{_cpu_generation(facts)}-{facts.get('cores') or 0}c"
    gpus = facts.get("cuda_devices") or []
    if gpus:
        words = [w for w in re.split(r"[^a-z0-9]+", gpus[0].lower()) if w and w != "nvidia"]
        name += f"-{words[0] if words else 'gpu'}x{len(gpus)}"
    return name


def code_version(package_dir: Path = PACKAGE_DIR) -> str:
    """ddp_lab's code as it runs (a digest of its .py files, so a checkout, a wheel or an edited copy alike) and
    torch's version: what islands that average each other's weights must share."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0" + path.read_bytes())
    import torch  # (the record tools import this module without torch)
    return f"ddp_lab {digest.hexdigest()[:12]}, torch {torch.__version__}"


def model_code(model) -> str:
    """A digest of the files that define `model`'s modules, but torch's and ddp_lab's (code_version has those):
    a user's model file, transformers' modeling file; "" where there are none (or no model)."""
    if model is None:
        return ""
    files = set()
    for module in model.modules():
        name = type(module).__module__
        if name.split(".")[0] in ("torch", "ddp_lab"):
            continue
        try:
            files.add(inspect.getsourcefile(type(module)))
        except TypeError:  # (a class made at run time: no file to hash)
            continue
    digest = hashlib.sha256()
    for path in sorted(f for f in files if f):
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:12] if files else ""


def git_state(package_dir: Path = PACKAGE_DIR) -> tuple[str | None, bool | None, list[str] | None]:
    """(commit, dirty, dirty files) of the checkout ddp_lab runs from, or (None, None, None).

    Only a checkout whose top level holds this very package counts: an installed copy
    in a virtual environment that happens to sit inside some git repository is not it.
    """
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True,
                                 text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != package_dir.resolve().parent:
        return None, None, None
    commit = (git("rev-parse", "HEAD") or "").strip() or None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    if commit is None or status is None:
        return commit, None, None
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return commit, bool(changed), changed[:20]


def machine_facts() -> dict:
    """Everything record.json says about the machine and the code, measured now."""
    import torch

    facts = cpu_facts()
    facts["cores"] = os.cpu_count()
    facts["cores_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    facts["cuda_devices"] = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                             if torch.cuda.is_available() else [])
    commit, dirty, dirty_files = git_state()
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_short_name(facts),
        "git_commit": commit, "git_dirty": dirty, "git_dirty_files": dirty_files,
        "torch": torch.__version__,
        "torch_cpu_capability": capability() if capability else None,
        "python": platform.python_version(),
        **facts,
        "env": {k: os.environ[k] for k in ENV_OF_INTEREST if k in os.environ},
    }


def command_line(module: str, args: Sequence[str]) -> str:
    """`python -m module args`, or the torchrun launch that started this rank."""
    if "LOCAL_WORLD_SIZE" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
        nodes = os.environ.get("GROUP_WORLD_SIZE", "1")
        launcher = ["torchrun"] + ([f"--nnodes={nodes}"] if nodes != "1" else []) + \
                   [f"--nproc_per_node={os.environ['LOCAL_WORLD_SIZE']}"]
    else:
        launcher = ["python"]
    return shlex.join([*launcher, "-m", module, *args])


def hydra_command(module: str) -> str | None:
    """command_line for a Hydra entry point (its overrides), None when Hydra did not start it."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return command_line(module, list(HydraConfig.get().overrides.task))


def write_record(folder: str | Path, command: str | None, extra: dict | None = None) -> Path:
    """Write folder/record.json: machine_facts(), the command and `extra`; returns its path.

    An existing record.json is never overwritten (it belongs to an earlier measurement).
    """
    path = Path(folder) / RECORD_NAME
    record = {"record": 1, "command": command, **machine_facts()}
    if command is None:
        record["command_note"] = "called from Python, not from the command line"
    record.update(extra or {})
    with open(path, "x") as f:  # "x": refuse to replace an earlier run's record
        json.dump(record, f, indent=1, default=str)
        f.write("\n")
    return path


if __name__ == "__main__":  # python -m ddp_lab.telemetry.provenance: this machine's facts
    json.dump(machine_facts(), sys.stdout, indent=2)
    print()
