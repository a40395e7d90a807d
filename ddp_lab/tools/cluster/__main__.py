"""`python -m ddp_lab.tools.cluster up|down|status|run|exec|link|kill|rejoin`: see ddp_lab.tools.cluster."""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from ddp_lab.tools.cluster import memory_limit, names, network
from ddp_lab.tools.cluster.commands import ClusterError
from ddp_lab.tools.cluster.islands_job import forget_job_record, read_job_record, write_job_record
from ddp_lab.tools.cluster.launch import Job, in_host
from ddp_lab.tools.cluster.shaping import DEFAULT_MTU, format_rate


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddp_lab.tools.cluster", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="create hosts NAME-0..NAME-(N-1) with links shaped to RATE")
    up.add_argument("--hosts", type=int, required=True, help="number of hosts")
    up.add_argument("--rate", required=True, help="each link's rate, both ways: 1gbit, 200mbit, ...")
    up.add_argument("--mtu", default=DEFAULT_MTU, help=f"every link's MTU in bytes (default {DEFAULT_MTU}; "
                    "9000: jumbo frames)")
    up.add_argument("--mem", default=None, help="each host's memory limit, e.g. 1g, 512m (a memory cgroup "
                    "per host; default: none, the machine's)")
    down = sub.add_parser("down", help="remove a cluster, also what an interrupted up left")
    sub.add_parser("status", help="list clusters, hosts, addresses and rates")
    run = sub.add_parser("run", help="one torchrun agent per host: run -- <what torchrun runs>")
    run.add_argument("--nproc-per-host", type=int, default=1, help="workers per host (default 1)")
    run.add_argument("--max-restarts", type=int, default=0, help="torchrun --max-restarts on every agent")
    run.add_argument("--hosts", type=int, default=None, help="use the first N hosts (default all)")
    run.add_argument("--nnodes", default=None, metavar="MIN:MAX",
                     help="elastic membership (torchrun's --nnodes MIN:MAX, MAX = the hosts used): "
                          "the job goes on while MIN hosts remain, and takes back a host that joins")
    run.add_argument("--only", default=None, metavar="HOST[,HOST]",
                     help="start the agents of these hosts only: a host joining a running elastic "
                          "job (give that job's --run-id, --port and --nnodes)")
    run.add_argument("--rdzv-conf", default="", metavar="K=V[,K=V]",
                     help="more torchrun --rdzv-conf settings, e.g. last_call_timeout=5")
    run.add_argument("--run-id", default=None, help="rendezvous id, names the run directory "
                     "(default NAME-<date>_<time>)")
    run.add_argument("--port", type=int, default=None, help="rendezvous port on host 0 (default random)")
    run.add_argument("--grace-s", type=float, default=60,
                     help="after a host fails, seconds the others get to end before SIGTERM")
    run.add_argument("--rejoin-after-s", type=float, default=None,
                     help="islands (sync.fault_tolerance=torchft): start a failed host's agent again after this "
                          "many seconds, into the running job")
    run.add_argument("command", nargs=argparse.REMAINDER, help="after --: e.g. -m ddp_lab.train")
    ex = sub.add_parser("exec", help="run a command inside one host: exec HOST -- <command>")
    ex.add_argument("host", help="a host name, e.g. lab-0")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    link = sub.add_parser("link", help="pull a host's cable (down) or plug it back (up)")
    link.add_argument("host", help="a host name, e.g. lab-1")
    link.add_argument("state", choices=["down", "up"])
    kill = sub.add_parser("kill", help="SIGKILL every process inside a host (a host lost at once)")
    kill.add_argument("host", help="a host name, e.g. lab-2")
    rejoin = sub.add_parser("rejoin", help="islands (sync.fault_tolerance=torchft): start a killed host's agent "
                                           "again, into the job that is running")
    rejoin.add_argument("host", help="a host name, e.g. lab-2")
    for s in (up, down, run, ex, link, kill, rejoin):
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
    if args.action == "run" and args.only and not (args.run_id and args.port):
        p.error("--only starts agents that join a running job: give its --run-id and --port")
    return args


def parse_nnodes(text: str | None, hosts: int) -> int | None:
    """--nnodes MIN:MAX (or N) -> MIN, checked against the hosts the job uses."""
    if text is None:
        return None
    lo, _, hi = text.partition(":")
    try:
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise ClusterError(f"--nnodes {text}: expected MIN:MAX, e.g. 2:{hosts}") from None
    if hi != hosts or not 1 <= lo <= hi:
        raise ClusterError(f"--nnodes {text}: MAX must be the {hosts} host(s) the job uses and "
                           f"1 <= MIN <= MAX (e.g. {max(1, hosts - 1)}:{hosts}; --hosts N uses fewer)")
    return lo


def parse_conf(text: str) -> dict:
    pairs = [kv.partition("=") for kv in text.split(",") if kv]
    if any(not k or not sep for k, sep, _ in pairs):
        raise ClusterError(f"--rdzv-conf {text}: expected KEY=VALUE[,KEY=VALUE]")
    return {k: v for k, _, v in pairs}


def ready_cluster(name: str) -> network.Cluster:
    cluster = network.find(names.check_name(name))
    if cluster is None:
        raise ClusterError(f"no cluster named {name}: create one with "
                           f"`python -m ddp_lab.tools.cluster up --hosts 2 --rate 1gbit --name {name}`")
    if not cluster.complete:
        raise ClusterError(f"cluster {name} is incomplete ({'; '.join(cluster.problems)}): "
                           f"`python -m ddp_lab.tools.cluster down --name {name}`, then up again")
    return cluster


def show(clusters: list[network.Cluster]) -> None:
    if not clusters:
        print("no clusters (make one: python -m ddp_lab.tools.cluster up --hosts 2 --rate 1gbit)")
    for c in clusters:
        rate = format_rate(c.rate_bits) if c.rate_bits else "mixed or none"
        state = "" if c.complete else f"  INCOMPLETE ({'; '.join(c.problems)}): run down --name {c.name}"
        mtu = c.mtu or "mixed or none"
        print(f"cluster {c.name}: {len(c.hosts)} host(s), links {rate} each way, MTU {mtu}{state}")
        for h in c.hosts:
            rate = format_rate(h.rate_bits) if h.rate_bits else "-"
            mem = f"mem {h.mem_bytes / 2**30:.2f} GiB " if h.mem_bytes else ""
            print(f"  {h.name:<16} {h.address:<15} {rate:<8} mtu {h.mtu or '-':<5} tcp {h.tcp or '-':<6} "
                  f"{mem}(netns {h.netns})")
        if c.switch_address:
            print(f"  {'(switch)':<16} {c.switch_address:<15} the bridge, where islands' Lighthouse runs")


def run_job(args) -> int:
    cluster = ready_cluster(args.name)
    if args.hosts is not None and not 1 <= args.hosts <= len(cluster.hosts):
        raise ClusterError(f"--hosts {args.hosts}: cluster {args.name} has {len(cluster.hosts)} hosts")
    used = args.hosts or len(cluster.hosts)
    only = args.only.split(",") if args.only else None
    for name in only or []:
        network.host_named(cluster, name)  # one line if there is no such host
    job = Job(cluster, args.command, args.nproc_per_host, args.max_restarts, args.hosts,
              args.run_id, args.port, min_hosts=parse_nnodes(args.nnodes, used), only=only,
              rdzv_conf=parse_conf(args.rdzv_conf), rejoin_after_s=args.rejoin_after_s)
    if job.islands and only is None:  # (what `rejoin HOST` starts again)
        write_job_record(args.name, job)
    return run_to_the_end(job, args.grace_s)


def rejoin_job(args) -> int:
    """An island's agent started again into the running job that `run` recorded."""
    cluster, rec = ready_cluster(args.name), read_job_record(args.name)
    job = Job(cluster, rec["command"], rec["nproc_per_host"], rec["max_restarts"], rec["hosts"], rec["run_id"],
              rec["port"], only=[network.host_named(cluster, args.host).name])
    return run_to_the_end(job, 60)


def run_to_the_end(job: Job, grace_s: float) -> int:
    def forward(signum, frame):
        job.signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    job.start()
    rc = job.wait(grace_s=grace_s)
    return rc if rc >= 0 else 128 - rc  # an agent killed by signal S: 128 + S, as a shell says


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.action == "up":
            mem = None if args.mem is None else memory_limit.host_limit(args.mem)
            show([network.create(args.name, args.hosts, args.rate, args.mtu, mem)])
        elif args.action == "down":
            removed = network.destroy(args.name) + forget_job_record(args.name)
            print("\n".join(f"removed {r}" for r in removed) or f"no cluster named {args.name}")
        elif args.action == "status":
            show(network.clusters())
        elif args.action == "run":
            return run_job(args)
        elif args.action == "rejoin":
            return rejoin_job(args)
        elif args.action == "link":
            host = network.set_link(ready_cluster(args.name), args.host, args.state == "up")
            print(f"{host.name}: link {args.state}")
        elif args.action == "kill":
            host = network.host_named(ready_cluster(args.name), args.host)
            print(f"{host.name}: killed {len(network.kill_processes(host))} process(es)")
        else:
            host = network.host_named(ready_cluster(args.name), args.host)
            rc = subprocess.run(in_host(host, args.command)).returncode
            return rc if rc >= 0 else 128 - rc  # killed by signal S (the host's memory limit): 128 + S
    except ClusterError as e:
        print(f"ddp_lab.tools.cluster: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
