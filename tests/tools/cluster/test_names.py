"""Inside each host, its own hostname and every host's name resolve to the right addresses."""
import json
import subprocess
import sys

from ddp_lab.tools.cluster import names
from ddp_lab.tools.cluster.launch import in_host

PROBE = ("import json, socket; print(json.dumps([socket.gethostname(), socket.getfqdn(), "
         "{n: socket.gethostbyname(n) for n in __import__('sys').argv[1:]}]))")


def test_every_host_resolves_every_name_to_its_eth0_address(two_hosts):
    addresses = {h.name: h.address for h in two_hosts.hosts}
    assert len(set(addresses.values())) == 2 and all(a.startswith("10.213.") for a in addresses.values())
    for host in two_hosts.hosts:
        out = subprocess.run(in_host(host, [sys.executable, "-c", PROBE, *addresses]),
                             capture_output=True, text=True, check=True).stdout
        hostname, fqdn, resolved = json.loads(out)
        assert (hostname, fqdn) == (host.name, host.name)  # torchrun advertises getfqdn()
        assert resolved == addresses


def test_exec_runs_a_command_inside_a_host(two_hosts):
    host = two_hosts.hosts[1]
    proc = subprocess.run([sys.executable, "-m", "ddp_lab.tools.cluster", "exec", "--name", two_hosts.name,
                           host.name, "--", "ip", "-4", "-o", "addr", "show", "eth0"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"inet {host.address}/24" in proc.stdout


def test_netns_names_parse_one_way_only():
    assert names.parse_netns("ddplab-lab-3") == ("lab", "3")
    assert names.parse_netns("ddplab-lab-sw") == ("lab", "sw")
    assert names.parse_netns("ddplab-a-b-0") is None  # names hold no dash
    assert names.parse_netns("lab-0") is None
    hosts = names.hosts_file({"lab-0": "10.213.0.1", "lab-1": "10.213.0.2"})
    assert "10.213.0.1\tlab-0\n10.213.0.2\tlab-1\n" in hosts and "127.0.0.1\tlocalhost" in hosts
