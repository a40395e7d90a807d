"""Running `ip` and `tc`, and saying in one line what is missing when they cannot run.

Making network namespaces needs CAP_SYS_ADMIN (`ip netns add` mounts them under
/run/netns) and CAP_NET_ADMIN (links, addresses, qdiscs); root has both unless
a container took them away, so the capabilities are read, not the user id.
"""
from __future__ import annotations

import os
import shutil
import subprocess

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
TOOLS = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux"}


class ClusterError(Exception):
    """Something the user can fix: printed as one line, exit status 2."""


def effective_capabilities() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def require_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        packages = sorted({TOOLS[t] for t in missing})
        raise ClusterError(f"{', '.join(missing)} not found: install {' and '.join(packages)} "
                           f"(e.g. apt-get install {' '.join(packages)})")


def require_privileges() -> None:
    """Refuse before anything is made, naming the capabilities that are missing."""
    caps = effective_capabilities()
    missing = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if missing:
        raise ClusterError(f"making network namespaces needs {' and '.join(missing)}, which this "
                           "process lacks: run as root (sudo python -m ddp_lab.tools.cluster ...), or in a "
                           "container started with --cap-add NET_ADMIN --cap-add SYS_ADMIN")


def run(*args: str, check: bool = True) -> str:
    """Run a command; its stdout. A failure raises ClusterError with the command and its error."""
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        reason = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}")
        raise ClusterError(f"`{' '.join(args)}` failed: {reason.splitlines()[0]}")
    return proc.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    return run("ip", *(("-n", netns) if netns else ()), *args, check=check)


def tc(*args: str, netns: str | None = None, check: bool = True) -> str:
    return run("tc", *(("-n", netns) if netns else ()), *args, check=check)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """The live processes started by `pid`, and theirs, and so on."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            # a process its parent has not reaped yet is a zombie: gone, though still listed
            found += [c for c in children if alive(c)]
            todo += children
    return found
