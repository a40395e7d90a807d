"""up makes what it says, down removes all of it (also after an interrupted up), refusals leave nothing."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ddp_lab.tools.cluster import ClusterError, create, find, names, network, shaping
from ddp_lab.tools.cluster.__main__ import main
from ddp_lab.tools.cluster.commands import ip
from tests.tools.cluster.conftest import between_two_hosts


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_lab.tools.cluster", *args], capture_output=True,
                          text=True, **kw)


def machine_state() -> tuple:
    """What the machine's own network and the namespace folders hold."""
    listing = sorted(os.listdir(names.RUN_NETNS)) if names.RUN_NETNS.is_dir() else []
    etc = sorted(os.listdir(names.ETC_NETNS)) if names.ETC_NETNS.is_dir() else []
    return ip("-br", "link"), ip("-4", "route", "show", "table", "all"), listing, etc


def parts_of(name: str) -> list[str]:
    return names.namespaces().get(name, []) + [str(f) for f in names.netns_folders(name)]


def test_up_status_down_leave_the_machine_as_it_was(cluster_name):
    before = machine_state()
    proc = cli("up", "--hosts", "3", "--rate", "100mbit", "--name", cluster_name)
    assert proc.returncode == 0, proc.stderr
    assert f"cluster {cluster_name}: 3 host(s), links 100mbit each way" in proc.stdout
    status = cli("status").stdout
    for i in range(3):
        assert f"{cluster_name}-{i} " in status
    c = find(cluster_name)
    assert c.complete and [h.name for h in c.hosts] == [f"{cluster_name}-{i}" for i in range(3)]
    assert c.rate_bits == 100 * 10 ** 6
    assert machine_state()[:2] == before[:2]  # no link, no route added to the machine's network
    again = cli("up", "--hosts", "2", "--rate", "1gbit", "--name", cluster_name)
    assert again.returncode == 2 and f"down --name {cluster_name}" in again.stderr

    down = cli("down", "--name", cluster_name)
    assert down.returncode == 0 and f"removed namespace ddplab-{cluster_name}-sw" in down.stdout
    assert machine_state() == before
    assert find(cluster_name) is None


def test_down_after_up_was_killed_half_way(cluster_name):
    before = machine_state()
    up = subprocess.Popen([sys.executable, "-m", "ddp_lab.tools.cluster", "up", "--hosts", "40",
                           "--rate", "1gbit", "--name", cluster_name],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    third = names.RUN_NETNS / names.host_netns(cluster_name, 2)
    deadline = time.monotonic() + 30
    while not third.exists() and up.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    up.send_signal(signal.SIGKILL)
    up.wait()
    left = find(cluster_name)
    assert left is not None and not left.complete  # 40 hosts take far longer than 3
    run = cli("run", "--name", cluster_name, "--", "-c", "pass")
    assert run.returncode == 2 and "incomplete" in run.stderr
    assert cli("down", "--name", cluster_name).returncode == 0
    assert parts_of(cluster_name) == [] and machine_state() == before


def test_down_removes_parts_left_in_any_state(cluster_name):
    ip("netns", "add", names.switch_netns(cluster_name))
    ip("netns", "add", names.host_netns(cluster_name, 0))
    (names.ETC_NETNS / names.host_netns(cluster_name, 1)).mkdir(parents=True)
    (names.RUN_NETNS / names.host_netns(cluster_name, 2)).touch()  # an add killed before its mount
    sleeper = subprocess.Popen(["ip", "netns", "exec", names.host_netns(cluster_name, 0), "sleep", "600"])
    removed = network.destroy(cluster_name)
    assert sleeper.wait(timeout=10) != 0  # a process left inside is stopped
    assert any(r.startswith("processes") for r in removed)
    assert parts_of(cluster_name) == []


def test_refused_without_capabilities_and_nothing_is_made(cluster_name):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop capabilities")
    proc = subprocess.run(["setpriv", "--bounding-set=-net_admin,-sys_admin", sys.executable, "-m",
                           "ddp_lab.tools.cluster", "up", "--hosts", "2", "--rate", "1gbit", "--name",
                           cluster_name], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "CAP_NET_ADMIN and CAP_SYS_ADMIN" in proc.stderr
    assert "run as root" in proc.stderr
    assert parts_of(cluster_name) == []


def test_a_missing_qdisc_is_named_and_nothing_is_left(cluster_name, monkeypatch):
    monkeypatch.setattr(shaping, "QDISC", "nosuchqdisc")
    with pytest.raises(ClusterError, match="no nosuchqdisc qdisc.*modprobe sch_nosuchqdisc"):
        create(cluster_name, 2, "1gbit")
    assert parts_of(cluster_name) == []


def test_a_refused_packet_size_is_named_and_nothing_is_left(cluster_name, monkeypatch):
    monkeypatch.setattr(shaping, "largest_packet_bytes", lambda bits: 2 ** 40)  # no u32
    with pytest.raises(ClusterError, match="within the shaper's burst.*gso_max_size"):
        create(cluster_name, 2, "1gbit")
    assert parts_of(cluster_name) == []


def test_bad_names_and_host_counts_are_refused_before_anything_is_made(cluster_name, capsys):
    for args, says in ((["--name", "Lab-1"], "--name"), (["--name", "x" * 16], "--name"),
                       (["--hosts", "0"], "--hosts 0"), (["--rate", "1gb"], "--rate"),
                       (["--mtu", "65536"], "--mtu")):
        full = {"--hosts": "2", "--rate": "1gbit", "--name": cluster_name}
        full.update(dict(zip(args[::2], args[1::2])))
        try:  # (in this process: `cluster up` refuses these before it makes anything)
            rc = main(["up", *[x for kv in full.items() for x in kv]])
        except SystemExit as e:  # argparse's refusals
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and says in err, err
    assert parts_of(cluster_name) == []


# Host 1 takes one TCP connection and counts what arrives; host 0 sends 1 MiB.
# Each side prints its segment size (TCP_MAXSEG: the MTU less IP, TCP and
# timestamp headers, as the two ends agreed it).
SEGMENT_PROBE = textwrap.dedent("""
    import socket, sys
    if sys.argv[1] == "listen":
        server = socket.create_server(("0.0.0.0", 29518)); server.settimeout(30)
        print("listening", flush=True)
        conn, _ = server.accept(); conn.settimeout(30); got = 0
        while chunk := conn.recv(1 << 16):
            got += len(chunk)
        print(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG), got)
    else:
        s = socket.create_connection((sys.argv[2], 29518), timeout=30)
        print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
        s.sendall(bytes(1 << 20)); s.close()
""")


def segments_between(cluster, tmp_path) -> tuple[int, int, int]:
    """(client's segment size, server's, bytes the server got) for 1 MiB from host 0 to host 1."""
    client, server = between_two_hosts(cluster, SEGMENT_PROBE, tmp_path)
    served, got = server.split()
    return int(client), int(served), int(got)


def test_the_default_mtu_is_1500_and_tcp_segments_fit_it(two_hosts, tmp_path):
    assert two_hosts.mtu == shaping.DEFAULT_MTU == 1500
    assert segments_between(two_hosts, tmp_path) == (1448, 1448, 1 << 20)


def test_jumbo_frames_reach_every_device_and_carry_tcp(cluster_name, tmp_path):
    proc = cli("up", "--hosts", "2", "--rate", "200mbit", "--mtu", "9000", "--name", cluster_name)
    assert proc.returncode == 0, proc.stderr
    assert "links 200mbit each way, MTU 9000" in proc.stdout
    c = find(cluster_name)
    assert c.complete and [h.mtu for h in c.hosts] == [9000, 9000]
    switch = names.switch_netns(cluster_name)
    assert [network._mtu(switch, dev) for dev in ("v0", "v1", network.BRIDGE)] == [9000] * 3
    # a segment larger than 1500 bytes crosses the bridge: a device left at 1500 would drop it
    assert segments_between(c, tmp_path) == (8948, 8948, 1 << 20)


def test_the_payload_share_of_a_link_follows_its_mtu():
    assert shaping.tcp_payload_share(1500) == 1448 / 1514
    assert round(shaping.tcp_payload_share(9000), 4) == 0.9927
    assert shaping.parse_mtu("9000") == 9000
    for bad in ("9001", "575", "jumbo", ""):
        with pytest.raises(ClusterError, match="--mtu"):
            shaping.parse_mtu(bad)
