"""A cluster on one machine: emulated hosts with shaped links, for torchrun to launch on.

    python -m ddp_lab.tools.cluster up --hosts 4 --rate 1gbit        # hosts lab-0 .. lab-3
    python -m ddp_lab.tools.cluster up --hosts 4 --rate 1gbit --mtu 9000 --name jumbo  # jumbo frames
    python -m ddp_lab.tools.cluster up --hosts 2 --rate 1gbit --mem 1g --name small    # 1 GiB per host
    python -m ddp_lab.tools.cluster status
    python -m ddp_lab.tools.cluster run --nproc-per-host 1 -- -m ddp_lab.train trainer.epochs=1
    python -m ddp_lab.tools.cluster exec lab-1 -- getent hosts lab-0
    python -m ddp_lab.tools.cluster link lab-1 down                  # pull its cable (and: up)
    python -m ddp_lab.tools.cluster kill lab-2                       # every process of lab-2, SIGKILL
    python -m ddp_lab.tools.cluster down

A test bed, not a launcher: each emulated host is a Linux network namespace
with its own link into a bridge, both directions of the link shaped to a rate
with a token bucket, its own hostname and /etc/hosts; `run` starts one
ordinary torchrun agent per host there (c10d rendezvous at host 0). Needs root
(CAP_NET_ADMIN and CAP_SYS_ADMIN). The hosts share this machine's CPU cores
and GPUs, and its memory unless `--mem` limits each host's (memory_limit.py): only the network
and that limit are emulated.

In Python (tests, benchmarks):

    from ddp_lab.tools.cluster import emulated, running
    with emulated(2, "200mbit", "mylab") as cluster, \\
            running(cluster, ["-m", "ddp_lab.train", "trainer.epochs=1"]) as job:
        rc = job.wait()
"""
from ddp_lab.tools.cluster.commands import ClusterError
from ddp_lab.tools.cluster.launch import Job, running
from ddp_lab.tools.cluster.network import Cluster, Host, clusters, create, destroy, emulated, find
from ddp_lab.tools.cluster.shaping import format_rate, parse_rate
from ddp_lab.tools.cluster.sharing import thread_share

__all__ = ["Cluster", "ClusterError", "Host", "Job", "clusters", "create", "destroy", "emulated",
           "find", "format_rate", "parse_rate", "running", "thread_share"]
