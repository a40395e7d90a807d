"""`python -m ddp_lab.cluster up|down|status|run|exec`: see ddp_lab.cluster."""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from ddp_lab.cluster import names, network
from ddp_lab.cluster.commands import ClusterError
from ddp_lab.cluster.launch import Job, in_host
from ddp_lab.cluster.shaping import format_rate


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.cluster", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="create hosts NAME-0..NAME-(N-1) with links shaped to RATE")
    up.add_argument("--hosts", type=int, required=True, help="number of hosts")
    up.add_argument("--rate", required=True, help="each link's rate, both ways: 1gbit, 200mbit, ...")
    down = sub.add_parser("down", help="remove a cluster, also what an interrupted up left")
    sub.add_parser("status", help="list clusters, hosts, addresses and rates")
    run = sub.add_parser("run", help="one torchrun agent per host: run -- <what torchrun runs>")
    run.add_argument("--nproc-per-host", type=int, default=1, help="workers per host (default 1)")
    run.add_argument("--max-restarts", type=int, default=0, help="torchrun --max-restarts on every agent")
    run.add_argument("--hosts", type=int, default=None, help="use the first N hosts (default all)")
    run.add_argument("--run-id", default=None, help="rendezvous id, names the run directory "
                     "(default NAME-<date>_<time>)")
    run.add_argument("--port", type=int, default=None, help="rendezvous port on host 0 (default random)")
    run.add_argument("--grace-s", type=float, default=60,
                     help="after a host fails, seconds the others get to end before SIGTERM")
    run.add_argument("command", nargs=argparse.REMAINDER, help="after --: e.g. -m ddp_lab.train")
    ex = sub.add_parser("exec", help="run a command inside one host: exec HOST -- <command>")
    ex.add_argument("host", help="a host name, e.g. lab-0")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    link = sub.add_parser("link", help="pull a host's cable (down) or plug it back (up)")
    link.add_argument("host", help="a host name, e.g. lab-1")
    link.add_argument("state", choices=["down", "up"])
    for s in (up, down, run, ex, link):
        s.add_argument("--name", default=names.DEFAULT_NAME,
                       help=f"cluster name (default {names.DEFAULT_NAME})")
    args = p.parse_args(argv)
    if hasattr(args, "command"):
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not args.command:
            p.error(f"{args.action}: give the command after --, e.g. "
                    + ("run -- -m ddp_lab.train" if args.action == "run" else "exec lab-0 -- hostname"))
    if args.action == "run" and (args.nproc_per_host < 1 or args.max_restarts < 0):
        p.error("--nproc-per-host must be >= 1 and --max-restarts >= 0")
    return args


def ready_cluster(name: str) -> network.Cluster:
    cluster = network.find(names.check_name(name))
    if cluster is None:
        raise ClusterError(f"no cluster named {name}: create one with "
                           f"`python -m ddp_lab.cluster up --hosts 2 --rate 1gbit --name {name}`")
    if not cluster.complete:
        raise ClusterError(f"cluster {name} is incomplete ({'; '.join(cluster.problems)}): "
                           f"`python -m ddp_lab.cluster down --name {name}`, then up again")
    return cluster


def show(clusters: list[network.Cluster]) -> None:
    if not clusters:
        print("no clusters (make one: python -m ddp_lab.cluster up --hosts 2 --rate 1gbit)")
    for c in clusters:
        rate = format_rate(c.rate_bits) if c.rate_bits else "mixed or none"
        state = "" if c.complete else f"  INCOMPLETE ({'; '.join(c.problems)}): run down --name {c.name}"
        print(f"cluster {c.name}: {len(c.hosts)} host(s), links {rate} each way{state}")
        for h in c.hosts:
            rate = format_rate(h.rate_bits) if h.rate_bits else "-"
            print(f"  {h.name:<16} {h.address:<15} {rate:<8} (netns {h.netns})")


def run_job(args) -> int:
    cluster = ready_cluster(args.name)
    if args.hosts is not None and not 1 <= args.hosts <= len(cluster.hosts):
        raise ClusterError(f"--hosts {args.hosts}: cluster {args.name} has {len(cluster.hosts)} hosts")
    job = Job(cluster, args.command, args.nproc_per_host, args.max_restarts, args.hosts,
              args.run_id, args.port)

    def forward(signum, frame):
        job.signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    job.start()
    rc = job.wait(grace_s=args.grace_s)
    return rc if rc >= 0 else 128 - rc  # an agent killed by signal S: 128 + S, as a shell says


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.action == "up":
            show([network.create(args.name, args.hosts, args.rate)])
        elif args.action == "down":
            removed = network.destroy(args.name)
            print("\n".join(f"removed {r}" for r in removed) or f"no cluster named {args.name}")
        elif args.action == "status":
            show(network.clusters())
        elif args.action == "run":
            return run_job(args)
        elif args.action == "link":
            host = network.set_link(ready_cluster(args.name), args.host, args.state == "up")
            print(f"{host.name}: link {args.state}")
        else:
            host = next((h for h in ready_cluster(args.name).hosts if h.name == args.host), None)
            if host is None:
                raise ClusterError(f"cluster {args.name} has no host {args.host!r}; see "
                                   "python -m ddp_lab.cluster status")
            return subprocess.run(in_host(host, args.command)).returncode
    except ClusterError as e:
        print(f"ddp_lab.cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
