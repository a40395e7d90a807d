"""torchrun across the emulated hosts: one agent per host, inside its namespace and hostname.

Every agent joins one c10d rendezvous served by host 0's agent, under one
rendezvous id, so all workers share TORCHELASTIC_RUN_ID and with it the run
directory (ddp_lab.config). gloo binds to the host's eth0
(GLOO_SOCKET_IFNAME), so its traffic crosses the shaped links, never loopback.

The hosts share this machine's cores and GPUs: ddp_lab.tools.cluster.sharing
gives each worker its share of threads and says how they are shared.

Elastic membership (`min_hosts` below the number of hosts): torchrun's own
`--nnodes=MIN:MAX`. When a host is lost, the agents left restart their
workers (one of `--max-restarts`) and meet again without it, as long as MIN
remain; an agent started again on that host (`join`) is seen by the others
as waiting, and they restart their workers once more (not counted as a
restart) to take it in. Host 0 serves the rendezvous, so it is the one host
the job cannot lose (torchrun's c10d backend; an etcd rendezvous would not
have that single point).

Islands under torchft (`islands`, when the command says sync.fault_tolerance=torchft): each host is its
own torchrun job (standalone: its own rendezvous), its island DDP_LAB_ISLAND = the host's index, its run
directory <run id>-island<i>; a torchft Lighthouse runs on the switch (the bridge's address,
TORCHFT_LIGHTHOUSE, the job's port), a machine of its own that no host takes along when it is lost (on a
cluster made before the switch had an address: on host 0, then the host the job cannot lose). A host that
fails does not stop the others (they go on without it); `rejoin` starts its agent again into the running
job (the job's record: islands_job.py). The job's exit status is each island's last agent's, but for one
that failed after another completed the run (too late to rejoin it: islands_job.py).
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from ddp_lab.tools.cluster import memory_limit, names
from ddp_lab.tools.cluster.commands import ClusterError, descendants
from ddp_lab.tools.cluster.islands_job import FAULT_TOLERANT, islands_rc
from ddp_lab.tools.cluster.network import HOST_LINK, Cluster, Host, host_named, links_down
from ddp_lab.tools.cluster.sharing import share

# Runs inside `unshare --uts`: give this process the host's name; where the host has a memory
# limit, mount the memory cgroups where a process looks for its limit (`ip netns exec` mounted
# a /sys of its own without them: ddp_lab's memory check reads it there); then become torchrun.
SET_HOSTNAME = ("import os,socket,sys; socket.sethostname(sys.argv[1]); sys.argv[2] and os.system("
                "'mount -t tmpfs none /sys/fs/cgroup && mkdir /sys/fs/cgroup/memory && "
                "mount -t cgroup -o memory none /sys/fs/cgroup/memory'); os.execvp(sys.argv[3], sys.argv[3:])")
# Runs first, outside the namespace: join the host's memory cgroup where it has one (cluster
# up --mem), then become `ip netns exec`.
JOIN_CGROUP = ("import os,sys; c = sys.argv[1]; c and open(c, 'w').write(str(os.getpid())); "
               "os.execvp(sys.argv[2], sys.argv[2:])")
TERM_GRACE_S = 30  # after SIGTERM, as torchrun waits for its workers, then SIGKILL
# the Lighthouse's timeouts: a quiet island is dropped after 2 s; a quorum waits up to 10 s for one heartbeating
LIGHTHOUSE_OPTIONS = ["--min_replicas", "1", "--heartbeat_timeout_ms", "2000", "--join_timeout_ms", "10000"]
IDLE_S = 5  # an agent without workers after another host failed: stopped after this


def in_host(host: Host, command: list[str]) -> list[str]:
    """`command` run inside the host: its network namespace, /etc/hosts and hostname."""
    return [sys.executable, "-c", JOIN_CGROUP, memory_limit.join_path(host.netns),
            "ip", "netns", "exec", host.netns, "unshare", "--uts", "--",
            sys.executable, "-c", SET_HOSTNAME, host.name, "1" if host.mem_bytes else "", *command]


@dataclass
class Agent:
    host: Host
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)  # stdout and stderr, prefixed, in order
    readers: list[threading.Thread] = field(default_factory=list)
    ended_at: float | None = None
    idle_since: float | None = None  # when its last worker ended, while it still runs


class Job:
    """A torchrun job across the first `hosts` hosts of a cluster (all by default).

    job = Job(cluster, ["-m", "ddp_lab.train", "trainer.epochs=1"]); job.start(); rc = job.wait()
    Output lines go to `out` (stdout) and `err` (stderr) prefixed with the host's
    name, and are kept in agent.lines; None for either keeps them only.
    """

    def __init__(self, cluster: Cluster, command: list[str], nproc_per_host: int = 1,
                 max_restarts: int = 0, hosts: int | None = None, run_id: str | None = None,
                 port: int | None = None, env: dict | None = None, cwd: str | None = None,
                 out: TextIO | None = sys.stdout, err: TextIO | None = sys.stderr,
                 min_hosts: int | None = None, only: list[str] | None = None,
                 rdzv_conf: dict | None = None, rejoin_after_s: float | None = None):
        self.cluster, self.command = cluster, list(command)
        self.islands = FAULT_TOLERANT in self.command  # each host its own job, a torchft island
        self.lighthouse: subprocess.Popen | None = None
        self.rejoin_after_s = rejoin_after_s  # islands: a failed host's agent started again after this
        self.hosts = cluster.hosts[:hosts] if hosts else list(cluster.hosts)
        self.min_hosts = min_hosts or len(self.hosts)  # below len(hosts): elastic
        # only: start agents on these hosts alone (one that rejoins a running job)
        self.starting = [h for h in self.hosts if only is None or h.name in only]
        self.rdzv_conf = dict(rdzv_conf or {})
        self.nproc_per_host, self.max_restarts = nproc_per_host, max_restarts
        self.run_id = run_id or f"{cluster.name}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
        self.port = port or random.randrange(20000, 32000)  # below Linux's ephemeral ports
        self.extra_env, self.cwd, self.out, self.err = dict(env or {}), cwd, out, err
        self.agents: list[Agent] = []
        self.notes: list[str] = []  # what the job itself said (threads, failures), in order
        self._lock = threading.Lock()

    def environment(self) -> tuple[dict, str]:
        """The agents' environment, and one line saying how the machine is shared."""
        env = {**os.environ, "GLOO_SOCKET_IFNAME": HOST_LINK, "NCCL_SOCKET_IFNAME": HOST_LINK,
               "PYTHONUNBUFFERED": "1", **self.extra_env}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        if self.elastic:
            # torchrun's agents share their rendezvous store with their workers, and each
            # agent reads its address once, at its first rendezvous, keeping it for later
            # rounds (dynamic_rendezvous.next_rendezvous, torch 2.4-2.14): an agent that
            # joins later waits for an address no one writes again, and the round never
            # starts. With its own store per round, every agent reads the address anew.
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        return env, share(env, len(self.hosts), self.nproc_per_host)

    @property
    def elastic(self) -> bool:
        return self.min_hosts < len(self.hosts)

    def island_env(self, host: Host) -> dict:
        """Islands: this host's island, its run directory's name and where the Lighthouse listens."""
        if not self.islands:
            return {}
        i = self.hosts.index(host)
        return {"DDP_LAB_ISLAND": str(i), "DDP_LAB_RUN_ID": f"{self.run_id}-island{i}",
                "TORCHFT_LIGHTHOUSE": f"http://{self.lighthouse_address}:{self.port}"}

    @property
    def lighthouse_address(self) -> str:
        """Where the islands' Lighthouse listens: the switch, or host 0 on a cluster older than its address."""
        return self.cluster.switch_address or self.hosts[0].address

    def torchrun(self, host: Host, again: bool = False) -> list[str]:
        if self.islands:  # (its own job: a rendezvous of its own inside the host)
            # (started again: into its run directory, from its newest checkpoint if any, then healed from a peer)
            resume = ["trainer.resume=auto"] if again and not any(a.startswith("trainer.resume=") for a in
                                                                   self.command) else []
            return [sys.executable, "-m", "ddp_lab.distributed.torchrun", "--standalone",
                    f"--nproc-per-node={self.nproc_per_host}", f"--max-restarts={self.max_restarts}", *self.command,
                    *resume]
        nnodes = f"{self.min_hosts}:{len(self.hosts)}" if self.elastic else str(len(self.hosts))
        conf = ",".join(f"{k}={v}" for k, v in {"is_host": host == self.hosts[0], **self.rdzv_conf}.items())
        return [sys.executable, "-m", "ddp_lab.distributed.torchrun", f"--nnodes={nnodes}",
                f"--nproc-per-node={self.nproc_per_host}", f"--max-restarts={self.max_restarts}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={self.hosts[0].name}:{self.port}",
                f"--rdzv-id={self.run_id}", f"--rdzv-conf={conf}", *self.command]

    def start(self) -> Job:
        self.oom_kills_before = {h.name: memory_limit.oom_kills(h.netns) for h in self.hosts}
        env, note = self.environment()
        on = "the switch" if self.cluster.switch_address else self.hosts[0].name
        where = (f"a torchft Lighthouse on {on} ({self.lighthouse_address}:{self.port}), each host an island"
                 if self.islands
                 else f"rendezvous {self.hosts[0].name}:{self.port}")
        self._say(f"ddp_lab.tools.cluster: {note}; run id {self.run_id}, {where}" +
                  (f", {self.min_hosts} to {len(self.hosts)} hosts (elastic)" if self.elastic else ""))
        if self.islands and self.starting == self.hosts:  # (a rejoin finds the job's Lighthouse running)
            self._start_lighthouse(env)
        for host in self.starting:
            self._start_agent(host, env, again=self.starting != self.hosts)
        return self

    def join(self, host_name: str) -> Agent:
        """Start (again) the agent of one host, into this job's rendezvous: for an elastic
        job, the host comes back and the others take it in at their next rendezvous."""
        host = host_named(self.cluster, host_name)
        if any(a.host == host and a.proc.poll() is None for a in self.agents):
            raise ValueError(f"{host_name} already runs an agent of this job")
        self._say(f"ddp_lab.tools.cluster: {host_name} joins run {self.run_id}")
        return self._start_agent(host, self.environment()[0], again=True)

    def _start_lighthouse(self, env: dict) -> None:
        exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
        if not os.path.exists(exe):
            raise ClusterError(f"{FAULT_TOLERANT} needs torchft's Lighthouse ({exe}): pip install torchft")
        serve = [exe, *LIGHTHOUSE_OPTIONS, "--bind", f"[::]:{self.port}"]
        self.lighthouse = subprocess.Popen(
            ["ip", "netns", "exec", names.switch_netns(self.cluster.name), *serve] if self.cluster.switch_address
            else in_host(self.hosts[0], serve),
            env={**env, "RUST_LOG": "warn"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        time.sleep(0.5)  # (listening before the first island asks)

    def _start_agent(self, host: Host, env: dict, again: bool = False) -> Agent:
        # Own session: a Ctrl-C at the terminal reaches the agents once, forwarded by us.
        env = {**env, **self.island_env(host)}
        proc = subprocess.Popen(in_host(host, self.torchrun(host, again)), env=env, cwd=self.cwd, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, errors="replace")
        agent = Agent(host, proc)
        for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
            t = threading.Thread(target=self._relay, args=(agent, stream, sink), daemon=True)
            t.start()
            agent.readers.append(t)
        with self._lock:
            self.agents.append(agent)
        return agent

    def _relay(self, agent: Agent, stream, sink) -> None:
        for line in stream:
            text = f"[{agent.host.name}] {line}"
            with self._lock:
                agent.lines.append(text)
                if sink is not None:
                    sink.write(text)
                    sink.flush()

    def _say(self, line: str) -> None:
        self.notes.append(line + "\n")
        if self.err is not None:
            self.err.write(line + "\n")
            self.err.flush()

    def signal(self, sig: int) -> None:
        """Send `sig` to every agent still running (torchrun passes it on to its workers)."""
        for a in self.agents:
            if a.proc.poll() is None:
                os.kill(a.proc.pid, sig)

    def poll(self) -> list[int | None]:
        now = time.monotonic()
        for a in self.agents:
            if a.ended_at is None and a.proc.poll() is not None:
                a.ended_at = now
        return [a.proc.returncode for a in self.agents]

    def wait(self, timeout: float | None = None, grace_s: float = 60) -> int:
        """Wait for every agent; the job's exit status (that of the first agent to fail, else 0).

        Once an agent has failed, a job of a fixed host count cannot go on (every
        agent's rendezvous needs all N hosts), so no host may keep it waiting: an
        agent whose workers have all ended is stopped after IDLE_S (it may be
        stuck trying to reach a host it lost), one whose workers still run gets
        `grace_s` for them to notice and report the failure. An elastic job goes
        on without the failed host, and succeeds if the training did (an agent
        ended 0). On `timeout`, every agent is stopped and TimeoutError raised.
        A failed job names the hosts whose link is down.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while None in self.poll():
            now = time.monotonic()
            failed = [a.ended_at for a in self.agents if a.proc.returncode not in (None, 0)]
            if self.islands and self.rejoin_after_s is not None:
                self._rejoin_the_lost(now)
            if failed and not self.elastic and not self.islands:  # (islands go on without a lost one)
                self._stop_the_stuck(now)
                if now > min(failed) + grace_s and None in self.poll():
                    self._say(f"ddp_lab.tools.cluster: a host failed {grace_s:g} s ago and the others "
                              "still run: stopping them")
                    self.stop()
            if deadline is not None and now > deadline:
                self.stop()
                raise TimeoutError(f"the job did not end within {timeout:g} s; its agents were stopped")
            time.sleep(0.1)
        for a in self.agents:
            for t in a.readers:
                t.join(timeout=5)
        self._stop_lighthouse()
        if self.islands:
            rc, late = islands_rc(self.agents)
            if late:
                self._say(f"ddp_lab.tools.cluster: {', '.join(late)} failed after other islands had completed the "
                          "run (too late to rejoin it): the completed islands' results stand")
            return rc
        failed = sorted((a.ended_at, i) for i, a in enumerate(self.agents) if a.proc.returncode)
        if self.elastic and any(a.proc.returncode == 0 for a in self.agents):
            return 0
        if failed:
            for name in links_down(self.cluster):
                self._say(f"ddp_lab.tools.cluster: the link of {name} is down")
            self._say_out_of_memory()
        return self.agents[failed[0][1]].proc.returncode if failed else 0

    def _say_out_of_memory(self) -> None:
        """Name the hosts whose memory limit killed a process of this job: out of memory, not a hang."""
        for h in self.hosts:
            killed = memory_limit.oom_kills(h.netns) - self.oom_kills_before.get(h.name, 0)
            if killed:
                self._say(f"ddp_lab.tools.cluster: {h.name} ran out of memory: its limit of "
                          f"{h.mem_bytes / 2**30:.2f} GiB (cluster up --mem) killed {killed} process(es) of this "
                          f"job; {after_out_of_memory(self.command)}, or check first: "
                          f"python -m ddp_lab.tools.costmodel.will_it_fit")

    def _stop_the_stuck(self, now: float) -> None:
        stuck = []
        for i, a in enumerate(self.agents):
            if a.proc.returncode is not None or self.worker_pids(i):
                a.idle_since = None
            elif a.idle_since is None:
                a.idle_since = now
            elif now - a.idle_since > IDLE_S:
                stuck.append(i)
        if stuck:
            hosts = ", ".join(self.agents[i].host.name for i in stuck)
            self._say(f"ddp_lab.tools.cluster: {hosts}: workers ended after another host failed, but the "
                      "agent still waits (on a host it cannot reach?): stopping it")
            self.stop(stuck, term_grace_s=IDLE_S)

    def _rejoin_the_lost(self, now: float) -> None:
        """Islands: start again the agent of a host whose last agent failed rejoin_after_s ago (as a scheduler
        replaces a lost machine), while another island still runs."""
        last = {a.host.name: a for a in self.agents}
        running = any(a.proc.returncode is None for a in last.values())
        for name, a in last.items():
            if running and a.proc.returncode not in (None, 0) and now > a.ended_at + self.rejoin_after_s:
                self.join(name)

    def _stop_lighthouse(self) -> None:
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            self.lighthouse.kill()
            self.lighthouse.wait()

    def stop(self, indices: list[int] | None = None, term_grace_s: float = TERM_GRACE_S) -> None:
        """SIGTERM the agents (all by default) still running, SIGKILL what is left after term_grace_s."""
        chosen = [(i, self.agents[i]) for i in (range(len(self.agents)) if indices is None else indices)]
        for _, a in chosen:
            if a.proc.poll() is None:
                os.kill(a.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + term_grace_s
        while any(a.proc.poll() is None for _, a in chosen) and time.monotonic() < deadline:
            time.sleep(0.1)
        for i, a in chosen:
            if a.proc.poll() is None:
                # torchrun starts each worker in a session of its own: kill those too
                for pid in [a.proc.pid, *self.worker_pids(i)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                a.proc.wait()
        if indices is None:
            self._stop_lighthouse()
        self.poll()

    def worker_pids(self, host_index: int) -> list[int]:
        """The live processes the agent of one host has started (its workers and theirs)."""
        return descendants(self.agents[host_index].proc.pid)

    def output(self, host_index: int | None = None) -> str:
        """One host's output, or (None) every host's and then what the job itself said."""
        agents = self.agents if host_index is None else [self.agents[host_index]]
        with self._lock:
            text = "".join(line for a in agents for line in a.lines)
        return text + "".join(self.notes) if host_index is None else text


def after_out_of_memory(command: list[str]) -> str:
    """What to try next after a rank ran out of memory, for the sync mode the job's overrides chose."""
    given = dict(a.split("=", 1) for a in command if "=" in a and not a.startswith("-"))
    sync, stage = given.get("sync", "auto"), given.get("sync.zero_stage", "1")
    lighter = ("trainer.activation_checkpointing=units (recompute each unit's forward), a smaller "
               "data.batch_size (trainer.grad_accum keeps the samples a step) or more hosts")
    if sync == "fsdp":
        return lighter
    if sync == "zero" and stage == "3":
        if given.get("sync.overlap_reduce", "true").lower() == "false":
            return lighter
        return f"sync.overlap_reduce=false (no reduce-scatter held while a unit computes: docs/memory.md), {lighter}"
    if sync == "zero":
        return f"shard the weights too (sync.zero_stage=3, or sync=fsdp), or {lighter}"
    return f"shard the model state (sync=fsdp, or sync=zero sync.zero_stage=3), or {lighter}"


@contextlib.contextmanager
def running(cluster: Cluster, command: list[str], **options):
    """`with running(cluster, ["-m", "ddp_lab.train"]) as job: rc = job.wait()`: a job that
    is stopped on the way out if still running (a failed test never leaves agents behind)."""
    job = Job(cluster, command, **options)
    try:
        yield job.start()
    finally:
        if None in job.poll():
            job.stop()
