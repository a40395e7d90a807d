"""What the parts of a cluster are called, and how its hosts find each other by name.

A cluster NAME of N hosts is made of network namespaces that `ip netns list`
shows as ddplab-NAME-0 .. ddplab-NAME-(N-1) (the hosts) and ddplab-NAME-sw (the
switch: the bridge every host's link plugs into). Everything is named from the
cluster's name, so `down` finds every part from the system itself, even those
an interrupted `up` left behind; no state file can go stale.

The hosts are called NAME-0 .. NAME-(N-1). All namespaces share the machine's
hostname, and torchrun advertises the hostname (socket.getfqdn()) as the
address of rank 0 (MASTER_ADDR): were it the machine's, every host would be
told to connect to itself. So each host's processes run with their own UTS
hostname (set by ddp_lab.tools.cluster.launch), and each host gets an /etc/hosts of
its own, /etc/netns/<namespace>/hosts, that maps every host name to its
address (`ip netns exec` bind-mounts it over /etc/hosts).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from ddp_lab.tools.cluster.commands import ClusterError

PREFIX = "ddplab"
SWITCH = "sw"
DEFAULT_NAME = "lab"
# No dash inside a name: "ddplab-a-b-0" must parse one way only.
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,14}\Z")
NETNS_RE = re.compile(rf"{PREFIX}-([a-z][a-z0-9]*)-({SWITCH}|\d+)\Z")
ETC_NETNS = Path("/etc/netns")
RUN_NETNS = Path("/run/netns")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ClusterError(f"--name {name!r}: use 1-15 lower-case letters and digits, starting "
                           "with a letter (e.g. --name lab)")
    return name


def host_name(cluster: str, index: int) -> str:
    return f"{cluster}-{index}"


def host_netns(cluster: str, index: int) -> str:
    return f"{PREFIX}-{cluster}-{index}"


def switch_netns(cluster: str) -> str:
    return f"{PREFIX}-{cluster}-{SWITCH}"


def parse_netns(netns: str) -> tuple[str, str] | None:
    """'ddplab-lab-3' -> ('lab', '3'); 'ddplab-lab-sw' -> ('lab', 'sw'); anything else: None."""
    m = NETNS_RE.match(netns)
    return (m.group(1), m.group(2)) if m else None


def namespaces() -> dict[str, list[str]]:
    """Every cluster's namespaces on this machine, by cluster name (from /run/netns)."""
    found: dict[str, list[str]] = {}
    names = [p.name for p in RUN_NETNS.iterdir()] if RUN_NETNS.is_dir() else []
    for netns in sorted(names):
        parsed = parse_netns(netns)
        if parsed:
            found.setdefault(parsed[0], []).append(netns)
    return found


def netns_folders(cluster: str) -> list[Path]:
    """/etc/netns/ddplab-<cluster>-* folders (hosts files), whether or not their namespace exists."""
    if not ETC_NETNS.is_dir():
        return []
    folders = []
    for folder in sorted(ETC_NETNS.iterdir()):
        parsed = parse_netns(folder.name)
        if parsed and parsed[0] == cluster:
            folders.append(folder)
    return folders


def hosts_file(names_to_addresses: dict[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for name, address in names_to_addresses.items()]
    return "\n".join(lines) + "\n"


def write_hosts_files(cluster: str, names_to_addresses: dict[str, str]) -> None:
    """/etc/netns/<host namespace>/{hosts,hostname} for every host of the cluster."""
    text = hosts_file(names_to_addresses)
    for index, name in enumerate(names_to_addresses):
        folder = ETC_NETNS / host_netns(cluster, index)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(text)
        (folder / "hostname").write_text(name + "\n")


def remove_hosts_files(cluster: str) -> list[str]:
    removed = []
    for folder in netns_folders(cluster):
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed
