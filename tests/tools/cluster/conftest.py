"""Emulated clusters for the tests: skipped, with the reason, where namespaces cannot be made.

Every cluster a test makes has a name no user would pick (pt + 8 random hex
digits) and is removed by a fixture's teardown, which pytest runs also when
the test fails.
"""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from ddp_lab.tools.cluster import ClusterError, destroy, emulated
from ddp_lab.tools.cluster.commands import require_privileges, require_tools

RATE = "200mbit"


def namespaces_or_skip() -> None:
    try:
        require_tools()
        require_privileges()
    except ClusterError as e:
        pytest.skip(f"cannot make network namespaces here: {e}")


def unique_name() -> str:
    return f"pt{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cluster_name():
    """A fresh cluster name; whatever was made under it is removed after the test."""
    namespaces_or_skip()
    name = unique_name()
    yield name
    destroy(name)


@pytest.fixture(scope="session")
def two_hosts():
    """Two hosts, links shaped to RATE both ways, shared by the tests that only use them."""
    namespaces_or_skip()
    with emulated(2, RATE, unique_name()) as cluster:
        yield cluster


def between_two_hosts(cluster, script, tmp_path) -> tuple[str, str]:
    """Run a Python `script` on host 1 (`listen`: it prints "listening" once it accepts, then
    its answer) and on host 0 (`connect ADDRESS`, host 1's address); what each printed."""
    path = tmp_path / "probe.py"
    path.write_text(script)
    server_host, client_host = cluster.hosts[1], cluster.hosts[0]
    server = subprocess.Popen(["ip", "netns", "exec", server_host.netns, sys.executable, str(path),
                               "listen"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        client = subprocess.run(["ip", "netns", "exec", client_host.netns, sys.executable, str(path),
                                 "connect", server_host.address], capture_output=True, text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        return client.stdout, server.communicate(timeout=60)[0]
    finally:
        server.kill()
