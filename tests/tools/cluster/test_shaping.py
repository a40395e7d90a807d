"""Rates parse as tc reads them, both directions of every link are shaped, and the shaping is real."""
import json
import subprocess
import textwrap

import pytest

from ddp_lab.tools.cluster import ClusterError, format_rate, names, parse_rate, running, shaping
from tests.tools.cluster.conftest import RATE, between_two_hosts

# One 8 MiB all-reduce between the two hosts, timed after a small warm-up call.
ALLREDUCE = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(16))
    x = torch.full((2 * 2**20,), float(dist.get_rank() + 1))
    t0 = time.perf_counter()
    dist.all_reduce(x)
    seconds = time.perf_counter() - t0
    if dist.get_rank() == 0:
        json.dump({"seconds": seconds, "value": x[0].item(), "all_equal": bool((x == x[0]).all())},
                  open(sys.argv[1], "w"))
    dist.destroy_process_group()
""")


def test_rates_parse_in_decimal_units_and_print_back():
    assert parse_rate("1gbit") == 10 ** 9
    assert parse_rate("200Mbit") == 200 * 10 ** 6
    assert parse_rate("1.5mbit") == 1_500_000
    assert [format_rate(b) for b in (10 ** 9, 2 * 10 ** 8, 1_500_000)] == ["1gbit", "200mbit", "1.5mbit"]
    for bad in ("1gb", "fast", "100", "-1mbit", "1kbit"):
        with pytest.raises(ClusterError, match="--rate"):
            parse_rate(bad)


def test_burst_is_1_ms_of_the_rate_and_at_least_16_kib():
    assert shaping.burst_bytes(10 ** 9) == 125_000          # 1 ms at 125 MB/s
    assert shaping.burst_bytes(10 ** 8) == 16 * 1024


def test_packets_fit_the_burst():
    # below ~520 Mbit/s 1 ms is less than a 64 KiB GSO packet, which tbf would cut up
    assert shaping.largest_packet_bytes(10 ** 9) == 65536           # Linux's default
    assert shaping.largest_packet_bytes(5 * 10 ** 8) == 54_687      # 7/8 of 62,500
    assert shaping.largest_packet_bytes(10 ** 8) == 14_336          # 7/8 of 16 KiB


def gso_max_size(netns, device):
    out = subprocess.run(["ip", "-n", netns, "-j", "-d", "link", "show", "dev", device],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["gso_max_size"]


def test_both_directions_of_every_link_are_shaped(two_hosts):
    bits = parse_rate(RATE)
    for i, host in enumerate(two_hosts.hosts):
        assert shaping.shaped_rate(host.netns, "eth0") == bits                       # it sends
        assert shaping.shaped_rate(names.switch_netns(two_hosts.name), f"v{i}") == bits  # it receives
        largest = shaping.largest_packet_bytes(bits)
        assert largest < shaping.burst_bytes(bits)
        assert gso_max_size(host.netns, "eth0") == largest
        assert gso_max_size(names.switch_netns(two_hosts.name), f"v{i}") == largest


def test_an_allreduce_takes_at_least_its_bytes_over_the_rate(two_hosts, tmp_path):
    script, result = tmp_path / "allreduce.py", tmp_path / "result.json"
    script.write_text(ALLREDUCE)
    with running(two_hosts, [str(script), str(result)], out=None, err=None) as job:
        rc = job.wait(timeout=120)
    assert rc == 0, job.output()[-3000:]
    r = json.loads(result.read_text())
    assert r["value"] == 3.0 and r["all_equal"]
    # 2 ranks: each sends its 8 MiB (half to reduce, half to share) over its own link,
    # of which one burst may pass at once; on loopback this takes a few ms
    nbytes = 8 * 2 ** 20
    floor = (nbytes - shaping.burst_bytes(parse_rate(RATE))) / (parse_rate(RATE) / 8)
    assert r["seconds"] >= floor, f"{r['seconds']:.3f} s < {floor:.3f} s: the links are not shaped"
    print(f"8 MiB all-reduce at {RATE}: {r['seconds']:.3f} s (floor {floor:.3f} s)")


# A TCP connection from host 0 to host 1: the congestion control each side's socket uses.
CONGESTION_PROBE = textwrap.dedent("""
    import socket, sys
    def algorithm(s):
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\\0").decode()
    if sys.argv[1] == "listen":
        server = socket.create_server(("0.0.0.0", 29517)); server.settimeout(30)
        print("listening", flush=True)
        conn, _ = server.accept(); print(algorithm(conn))
    else:
        print(algorithm(socket.create_connection((sys.argv[2], 29517), timeout=30)))
""")


def test_tcp_between_hosts_uses_the_pinned_congestion_control(two_hosts, tmp_path):
    # Not the machine's default: the first of CONGESTION_CONTROL the kernel has, on both ends.
    pinned = [shaping.congestion_control(h.netns, "eth0") for h in two_hosts.hosts]
    assert pinned[0] in shaping.CONGESTION_CONTROL and pinned == [pinned[0]] * 2
    client, server = between_two_hosts(two_hosts, CONGESTION_PROBE, tmp_path)
    assert client.strip() == pinned[0] and server.strip() == pinned[0]
