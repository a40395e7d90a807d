"""Link rates: parsing them, and shaping a link to one with a token bucket (tc's tbf).

tbf is the one shaper this relies on: it is in every distribution's kernel
(sch_tbf), while netem, fq and sfq are not always built. A tbf on a link's
sending side holds packets back until tokens, arriving at the rate, pay for
them; `burst` bytes of tokens can pile up while the link is idle.

The burst is about 1 ms of the rate (at least 16 KiB): a real port sends no
faster than its line rate, so the larger the burst, the more of a message
passes at memory speed after an idle gap (a 4 ms burst would carry most of
LeNet's 516 KB gradient at 1 Gbit/s), but every burst's worth of tokens costs
the shaper a timer wake-up. With 1 ms, gloo's all-reduce came within 3% of
TCP's payload limit; a 16 KiB burst held it under half, though that loss may
all come from such a bucket being smaller than TCP's packets (below).

A packet larger than the bucket never fits in it, and tbf then cuts it up
itself, at a cost of most of the link. TCP hands a device packets of up to
64 KiB (GSO: many segments passed down as one), more than 1 ms of any rate
below about 520 Mbit/s, so every shaped device takes packets of at most 7/8
of its burst (its gso_max_size; tbf counts each segment's headers too).
Measurements: docs/communication.md, "Rates between 100 Mbit/s and 1 Gbit/s".

`latency` bounds the queue behind the shaper: packets that would wait
longer are dropped, as a switch with full buffers drops them. 50 ms, since a
1 ms queue lost much of the throughput to drops.

Each frame carries the MTU's worth of IP packet plus a 14-byte Ethernet
header, all of which tbf counts against the rate; TCP's payload is the MTU
less 52 bytes of IP, TCP and timestamp headers. So a link's payload rate is
at most (MTU - 52) / (MTU + 14) of its rate: 95.6% at Linux's default MTU of
1500, 99.3% with 9000-byte jumbo frames (tcp_payload_share). A real
Ethernet wire also spends 24 bytes a frame on preamble, checksum and gap
(94.1% at 1500), which tbf does not count.

TCP's congestion control is part of how a link behaves, so every host's
route to the others names one (`congctl`) instead of inheriting the
machine's default, which differs between kernels: see CONGESTION_CONTROL.
"""
from __future__ import annotations

import json
import re

from ddp_lab.tools.cluster.commands import ClusterError, ip, tc

QDISC = "tbf"
QUEUE_LATENCY = "50ms"
BURST_SECONDS = 1e-3
MIN_BURST_BYTES = 16 * 1024
GSO_MAX_BYTES = 65536  # Linux's default gso_max_size
# Tried in order; reno is in every kernel. cubic is Linux's default and what
# most clusters run. Inherited, the machine's own choice decides the figures:
# under bbr, which paces each connection at its estimate of the rate,
# halving-doubling's exchanges (their connections idle between steps) ran
# late and the all-reduce slower (docs/communication.md, "Across a network").
CONGESTION_CONTROL = ("cubic", "reno")
DEFAULT_MTU = 1500  # Linux's default, and most Ethernet networks' MTU
# From IPv4's smallest datagram every host must take to the usual jumbo frame; a frame of
# 9000 + 14 bytes fits the smallest burst (MIN_BURST_BYTES), so tbf never cuts one up.
MTU_RANGE = (576, 9000)
FRAME_HEADER_BYTES = 14  # Ethernet header: counted by tbf, not part of the MTU
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12 (on by default in Linux)
UNITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}
RATE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\Z", re.IGNORECASE)


def parse_rate(text: str) -> int:
    """'1gbit' -> 1_000_000_000 bits per second (decimal units, as tc reads them)."""
    m = RATE_RE.match(str(text).strip())
    bits = round(float(m.group(1)) * UNITS[m.group(2).lower()]) if m else 0
    if not m or bits < 8000:
        raise ClusterError(f"--rate {text!r}: give bits per second with a unit, at least 8kbit, "
                           "e.g. --rate 1gbit, --rate 200mbit or --rate 100mbit")
    return bits


def format_rate(bits: int) -> str:
    """1_000_000_000 -> '1gbit', 200_000_000 -> '200mbit', 1_500_000 -> '1.5mbit'."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= UNITS[unit]:
            return f"{bits / UNITS[unit]:g}{unit}"
    return f"{bits}bit"


def parse_mtu(value) -> int:
    """--mtu 9000 -> 9000, checked against MTU_RANGE."""
    lo, hi = MTU_RANGE
    try:
        mtu = int(str(value).strip())
    except ValueError:
        mtu = 0
    if not lo <= mtu <= hi:
        raise ClusterError(f"--mtu {value!r}: give the largest IP packet in bytes, {lo} to {hi}, "
                           f"e.g. --mtu {DEFAULT_MTU} (the default) or --mtu 9000 (jumbo frames)")
    return mtu


def tcp_payload_share(mtu: int = DEFAULT_MTU) -> float:
    """The share of a shaped link's rate that TCP's payload can use (see the module's docstring)."""
    return (mtu - TCP_IP_HEADER_BYTES) / (mtu + FRAME_HEADER_BYTES)


def burst_bytes(bits: int) -> int:
    return max(MIN_BURST_BYTES, int(bits / 8 * BURST_SECONDS))


def largest_packet_bytes(bits: int) -> int:
    """The gso_max_size of a device shaped to `bits`: 7/8 of the burst, at most
    Linux's default of 64 KiB (see the module's docstring)."""
    return min(GSO_MAX_BYTES, burst_bytes(bits) * 7 // 8)


def shape(netns: str, device: str, bits: int) -> None:
    """Limit what `device` in `netns` sends to `bits` per second, in packets
    that fit the shaper's burst."""
    args = ("qdisc", "replace", "dev", device, "root", QDISC, "rate", f"{bits}bit",
            "burst", str(burst_bytes(bits)), "latency", QUEUE_LATENCY)
    try:
        tc(*args, netns=netns)
    except ClusterError as e:
        if "qdisc kind is unknown" in str(e) or "Unknown qdisc" in str(e):
            raise ClusterError(f"this kernel has no {QDISC} qdisc, which shapes the links: load it "
                               f"with `modprobe sch_{QDISC}` (a kernel built with "
                               f"CONFIG_NET_SCH_{QDISC.upper()})") from None
        raise
    try:
        ip("link", "set", "dev", device, "gso_max_size", str(largest_packet_bytes(bits)), netns=netns)
    except ClusterError as e:
        raise ClusterError(f"cannot keep {device}'s packets within the shaper's burst ({e}); "
                           "this needs a kernel and an iproute2 that can change a device's "
                           "gso_max_size") from None


def _listing(out: str) -> list[dict]:
    """What `ip -j` or `tc -j` printed; [] if nothing (a namespace or device gone)."""
    try:
        return json.loads(out or "[]")
    except json.JSONDecodeError:
        return []


def shaped_rate(netns: str, device: str) -> int | None:
    """The rate a tbf on `device` lets through, in bits per second; None if it has none."""
    for q in _listing(tc("-j", "qdisc", "show", "dev", device, netns=netns, check=False)):
        if q.get("kind") == QDISC and q.get("root"):
            return int(q["options"]["rate"]) * 8  # tc reports bytes per second
    return None


def set_congestion_control(netns: str, device: str, subnet: str, address: str) -> str:
    """Make TCP between the hosts use the first of CONGESTION_CONTROL this
    kernel has (a route attribute: a namespace's sysctl may refuse it); returns its name."""
    for algorithm in CONGESTION_CONTROL:
        try:
            ip("route", "replace", subnet, "dev", device, "proto", "kernel", "scope", "link",
               "src", address, "congctl", algorithm, netns=netns)
            return algorithm
        except ClusterError:
            continue
    raise ClusterError(f"this kernel has none of the TCP congestion controls "
                       f"{', '.join(CONGESTION_CONTROL)} (tcp_{CONGESTION_CONTROL[-1]} is built in "
                       "unless the kernel was configured without TCP)")


def congestion_control(netns: str, device: str) -> str | None:
    """The congestion control the route on `device` names; None if it names none."""
    for route in _listing(ip("-j", "route", "show", "dev", device, netns=netns, check=False)):
        for metric in route.get("metrics", []):
            if "congestion" in metric:
                return str(metric["congestion"])
    return None
