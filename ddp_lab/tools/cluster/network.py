"""Emulated hosts on one machine: a network namespace each, linked through a bridge.

    host namespace ddplab-NAME-i          switch namespace ddplab-NAME-sw
    lo, eth0 10.213.X.(i+1)/24  <-veth->  v<i> --- br0 (the bridge) 10.213.X.254 --- v<j> ...
    tbf on eth0: what host i sends        tbf on v<i>: what host i receives

The bridge's own address is where the switch namespace serves the hosts as a machine of its own: torchft
islands' Lighthouse runs there (launch.py), so that no host the job may lose takes it along.

The bridge sits in a namespace of its own, so nothing is added to the
machine's own network: no link, no address, no route. The hosts' subnet is a
private /24 that overlaps no route of the machine and no other cluster's.
Every host gets both directions of its link shaped to the same rate, as a
full-duplex NIC port into a switch, and the same MTU (--mtu: 1500, or 9000
for jumbo frames) on every device, as a real network needs.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import time
from dataclasses import dataclass, field

from ddp_lab.tools.cluster import memory_limit, names, shaping
from ddp_lab.tools.cluster.commands import ClusterError, alive, ip, require_privileges, require_tools

SUBNETS = [ipaddress.ip_network(f"10.213.{x}.0/24") for x in range(256)]
BRIDGE = "br0"
HOST_LINK = "eth0"
MAX_HOSTS = 250
SWITCH_HOST = 254  # the bridge's address in the hosts' /24


@dataclass
class Host:
    name: str      # its hostname, e.g. lab-0
    netns: str     # its network namespace, e.g. ddplab-lab-0
    address: str   # eth0's address
    rate_bits: int | None  # what its link is shaped to (None: unshaped or unknown)
    tcp: str | None = None  # the TCP congestion control its route names (shaping.CONGESTION_CONTROL)
    mtu: int | None = None  # eth0's MTU
    mem_bytes: int | None = None  # its memory limit (cluster up --mem; None: the machine's)


@dataclass
class Cluster:
    name: str
    hosts: list[Host]
    complete: bool = True  # False: parts are missing (an interrupted up); run down
    problems: list[str] = field(default_factory=list)
    switch_address: str | None = None  # the bridge's (None: a cluster made before it had one)

    @property
    def rate_bits(self) -> int | None:
        rates = {h.rate_bits for h in self.hosts}
        return rates.pop() if len(rates) == 1 else None

    @property
    def mtu(self) -> int | None:
        mtus = {h.mtu for h in self.hosts}
        return mtus.pop() if len(mtus) == 1 else None


def _host_address(netns: str, device: str = HOST_LINK) -> str | None:
    out = ip("-j", "-4", "addr", "show", "dev", device, netns=netns, check=False)
    for link in json.loads(out or "[]"):
        for a in link.get("addr_info", []):
            return a["local"]
    return None


def _mtu(netns: str, device: str) -> int | None:
    links = json.loads(ip("-j", "link", "show", "dev", device, netns=netns, check=False) or "[]")
    return links[0].get("mtu") if links else None


def find(cluster: str) -> Cluster | None:
    """The cluster as the system has it now (None if no part of it exists)."""
    found = names.namespaces().get(cluster, [])
    if not found and not names.netns_folders(cluster):
        return None
    indices = sorted(int(names.parse_netns(ns)[1]) for ns in found
                     if names.parse_netns(ns)[1] != names.SWITCH)
    hosts, problems = [], []
    if names.switch_netns(cluster) not in found:
        problems.append("no switch namespace")
    if indices != list(range(len(indices))) or not indices:
        problems.append(f"host namespaces {indices} are not 0..N-1")
    for i in indices:
        netns = names.host_netns(cluster, i)
        address = _host_address(netns)
        rate = shaping.shaped_rate(netns, HOST_LINK)
        if address is None or rate is None:
            problems.append(f"{names.host_name(cluster, i)} has no address or no shaped link")
        if not (names.ETC_NETNS / netns / "hosts").exists():
            problems.append(f"{names.host_name(cluster, i)} has no hosts file")
        hosts.append(Host(names.host_name(cluster, i), netns, address or "-", rate,
                          shaping.congestion_control(netns, HOST_LINK), _mtu(netns, HOST_LINK),
                          memory_limit.limit_of(netns)))
    switch = names.switch_netns(cluster)
    return Cluster(cluster, hosts, not problems, problems, _host_address(switch, BRIDGE) if switch in found else None)


def clusters() -> list[Cluster]:
    listed = set(names.namespaces())
    if names.ETC_NETNS.is_dir():
        listed |= {names.parse_netns(p.name)[0] for p in names.ETC_NETNS.iterdir()
                   if names.parse_netns(p.name)}
    return [c for c in (find(name) for name in sorted(listed)) if c is not None]


def free_subnet() -> ipaddress.IPv4Network:
    """The first of SUBNETS that no route of this machine and no other cluster uses."""
    taken = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(dst, strict=False))
    for c in clusters():
        taken += [ipaddress.ip_network(f"{h.address}/24", strict=False)
                  for h in c.hosts if h.address != "-"]
    for subnet in SUBNETS:
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise ClusterError(f"no free subnet among {SUBNETS[0]}..{SUBNETS[-1]}: remove a cluster "
                       "(python -m ddp_lab.tools.cluster status, then down --name NAME)")


def create(cluster: str, hosts: int, rate: str, mtu: int = shaping.DEFAULT_MTU, mem: int | None = None) -> Cluster:
    """Make the cluster (`mem`: each host's memory limit in bytes); on any failure (or Ctrl-C)
    remove what was made, then raise."""
    names.check_name(cluster)
    bits = shaping.parse_rate(rate)
    mtu = shaping.parse_mtu(mtu)
    if not 1 <= hosts <= MAX_HOSTS:
        raise ClusterError(f"--hosts {hosts}: give 1 to {MAX_HOSTS} hosts")
    require_tools()
    require_privileges()
    if mem is not None:
        memory_limit.require_controller()
    if find(cluster) is not None:
        raise ClusterError(f"a cluster named {cluster} exists (or an interrupted up left parts of "
                           f"it): remove it with `python -m ddp_lab.tools.cluster down --name {cluster}`, "
                           "or choose another --name")
    subnet = free_subnet()
    try:
        switch = names.switch_netns(cluster)
        ip("netns", "add", switch)
        ip("link", "add", BRIDGE, "type", "bridge", netns=switch)
        ip("link", "set", BRIDGE, "up", netns=switch)
        ip("addr", "add", f"{subnet.network_address + SWITCH_HOST}/{subnet.prefixlen}", "dev", BRIDGE, netns=switch)
        addresses = {}
        for i in range(hosts):
            netns, port = names.host_netns(cluster, i), f"v{i}"
            address = str(subnet.network_address + i + 1)
            ip("netns", "add", netns)
            ip("link", "add", port, "mtu", str(mtu), "type", "veth", "peer", "name", HOST_LINK,
               "mtu", str(mtu), "netns", netns, netns=switch)  # the bridge takes its ports' MTU
            ip("link", "set", port, "master", BRIDGE, "up", netns=switch)
            ip("addr", "add", f"{address}/{subnet.prefixlen}", "dev", HOST_LINK, netns=netns)
            ip("link", "set", HOST_LINK, "up", netns=netns)
            ip("link", "set", "lo", "up", netns=netns)
            shaping.set_congestion_control(netns, HOST_LINK, str(subnet), address)
            shaping.shape(netns, HOST_LINK, bits)   # what host i sends
            shaping.shape(switch, port, bits)       # what host i receives
            if mem is not None:
                memory_limit.limit(netns, mem)
            addresses[names.host_name(cluster, i)] = address
        names.write_hosts_files(cluster, addresses)
    except BaseException:
        destroy(cluster)
        raise
    return find(cluster)


def _stop_processes(netns: str) -> list[int]:
    """Processes still running inside a namespace (a job's leftovers): SIGTERM, then SIGKILL."""
    pids = [int(p) for p in ip("netns", "pids", netns, check=False).split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
    return pids


def destroy(cluster: str) -> list[str]:
    """Remove every part of the cluster that exists; what was removed, as lines to print."""
    names.check_name(cluster)
    removed = []
    for netns in names.namespaces().get(cluster, []):
        pids = _stop_processes(netns)
        if pids:
            removed.append(f"processes {' '.join(map(str, pids))} in {netns}")
        ip("netns", "del", netns, check=False)
        with contextlib.suppress(FileNotFoundError):  # a mount point an interrupted add left
            (names.RUN_NETNS / netns).unlink()
        removed.append(f"namespace {netns} (and its links)")
        if memory_limit.remove(netns):
            removed.append(f"memory cgroup {memory_limit.folder(netns)}")
    removed += [f"folder {f}" for f in names.remove_hosts_files(cluster)]
    return removed


def set_link(cluster: Cluster, host_name: str, up: bool) -> Host:
    """Pull (up=False) or plug back a host's cable: its port on the switch goes down or up."""
    host = host_named(cluster, host_name)
    port = f"v{cluster.hosts.index(host)}"
    ip("link", "set", port, "up" if up else "down", netns=names.switch_netns(cluster.name))
    return host


def host_named(cluster: Cluster, host_name: str) -> Host:
    host = next((h for h in cluster.hosts if h.name == host_name), None)
    if host is None:
        raise ClusterError(f"cluster {cluster.name} has no host {host_name!r}; see "
                           "python -m ddp_lab.tools.cluster status")
    return host


def kill_processes(host: Host) -> list[int]:
    """SIGKILL every process inside the host (its torchrun agent and workers): a host lost
    at once, as when its power goes. Returns the process ids killed."""
    pids = [int(p) for p in ip("netns", "pids", host.netns, check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def links_down(cluster: Cluster) -> list[str]:
    """Names of the hosts whose port on the switch is down."""
    down = []
    for i, host in enumerate(cluster.hosts):
        out = ip("-j", "link", "show", f"v{i}", netns=names.switch_netns(cluster.name), check=False)
        links = json.loads(out or "[]")
        if links and "UP" not in links[0].get("flags", []):
            down.append(host.name)
    return down


@contextlib.contextmanager
def emulated(hosts: int, rate: str, cluster: str = names.DEFAULT_NAME, mtu: int = shaping.DEFAULT_MTU,
             mem: int | None = None):
    """`with emulated(2, "1gbit", "mytest") as c:` a cluster that is removed on the way out."""
    made = create(cluster, hosts, rate, mtu, mem)
    try:
        yield made
    finally:
        destroy(cluster)
