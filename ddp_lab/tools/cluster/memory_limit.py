"""A memory limit per emulated host: a memory cgroup each (`cluster up --mem 1g`).

Every process started inside a host (its torchrun agent, the workers it forks) joins the
host's cgroup, /sys/fs/cgroup/memory/ddplab/<host namespace>/, so together they can hold no
more than the limit, as on a machine with that much memory: past it the kernel's OOM killer
SIGKILLs one of them (no swap is counted in: memory.memsw is limited as well where the kernel
accounts it). The kernel counts each kill in memory.oom_control's oom_kill, which the job
reads to say in one line that the limit, not a hang or a crash, stopped a rank.

cgroup v1's memory controller only (this is what the development machine mounts); on a machine
without it `up --mem` is refused in one line.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ddp_lab.tools.cluster.commands import ClusterError

ROOT = Path("/sys/fs/cgroup/memory")
UNLIMITED = 2**62  # cgroup v1 reports no limit as a page-rounded 2**63 - 1
SIZE = re.compile(r"^\s*([0-9.]+)\s*(b|kib|mib|gib|tib|kb|mb|gb|tb|k|m|g|t)?\s*$", re.I)
UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9,
         "tb": 10**12, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


# what a host's torchrun agent and one worker hold before any model (torch's libraries, the data, the
# process group): 700 MiB measured at the memory check (the memory-wall-8-hosts record); a limit below it
# kills every process at start-up
HOST_FLOOR = 700 * 2**20


def host_limit(text: str) -> int:
    """`cluster up --mem`: a size (parse_size) of at least HOST_FLOOR."""
    nbytes = parse_size(text)
    if nbytes < HOST_FLOOR:
        raise ClusterError(f"--mem {text}: {nbytes / 2**30:.2f} GiB a host is less than the "
                           f"{HOST_FLOOR / 2**30:.2f} GiB a torchrun agent and one worker hold before any model "
                           f"(torch's libraries, the data): give --mem 1g or more")
    return nbytes


def parse_size(text: str, flag: str = "--mem") -> int:
    """'2GiB', '1g' (binary), '500MB' (decimal) -> bytes."""
    m = SIZE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ClusterError(f"{flag} {text!r}: give a size with a unit, e.g. {flag} 2GiB or {flag} 512m")
    return int(float(m.group(1)) * UNITS[(m.group(2) or "b").lower()])


def folder(netns: str) -> Path:
    return ROOT / "ddplab" / netns


def require_controller() -> None:
    if not (ROOT / "memory.limit_in_bytes").exists():
        raise ClusterError(f"--mem needs cgroup v1's memory controller at {ROOT}, which this machine "
                           "does not mount: leave --mem out")


def limit(netns: str, nbytes: int) -> None:
    """Give the host `nbytes` of memory (and no swap)."""
    f = folder(netns)
    f.mkdir(parents=True, exist_ok=True)
    (f / "memory.limit_in_bytes").write_text(str(nbytes))
    if (f / "memory.memsw.limit_in_bytes").exists():  # (swap accounting on: memory + swap, the same)
        (f / "memory.memsw.limit_in_bytes").write_text(str(nbytes))


def limit_of(netns: str) -> int | None:
    """The host's memory limit in bytes (None: none set)."""
    try:
        value = int((folder(netns) / "memory.limit_in_bytes").read_text())
    except (OSError, ValueError):
        return None
    return value if value < UNLIMITED else None


def oom_kills(netns: str) -> int:
    """How many processes of the host the OOM killer has killed for its limit so far."""
    try:
        for line in (folder(netns) / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def join_path(netns: str) -> str:
    """The file a process writes its pid to, to join the host's cgroup ("" where it has none)."""
    return str(folder(netns) / "cgroup.procs") if limit_of(netns) is not None else ""


def remove(netns: str) -> bool:
    """Remove the host's cgroup (its processes stopped first); whether there was one."""
    f = folder(netns)
    if not f.exists():
        return False
    with contextlib.suppress(OSError):
        f.rmdir()
    with contextlib.suppress(OSError):
        f.parent.rmdir()  # the last host's: ddplab/ goes too
    return True
