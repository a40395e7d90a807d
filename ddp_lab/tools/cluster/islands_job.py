"""An islands job's bookkeeping (sync.fault_tolerance=torchft on the emulated cluster: each host an island):
the record `rejoin HOST` reads to start one host's agent again into the running job, and the job's exit
status."""
from __future__ import annotations

import json
from pathlib import Path

from ddp_lab.tools.cluster.commands import ClusterError

JOBS = Path("/run/ddplab")  # an islands job's record, by cluster (rejoin reads it)
FAULT_TOLERANT = "sync.fault_tolerance=torchft"  # the override that makes each host an island


def islands_rc(agents) -> tuple[int, list[str]]:
    """An islands job's exit status: each island's last agent says (a lost one started again ended with its
    own), but an island that failed after another had completed the run came too late to rejoin it (no peer
    left to heal it) and does not fail the job. Returns the status and those late islands."""
    last = {a.host.name: a for a in agents}
    done = min((a.ended_at for a in last.values() if a.proc.returncode == 0), default=None)
    late = [n for n, a in last.items() if a.proc.returncode and done is not None and a.ended_at >= done]
    return next((a.proc.returncode for n, a in last.items() if a.proc.returncode and n not in late), 0), late


def job_record_path(cluster: str) -> Path:
    return JOBS / f"{cluster}-islands-job.json"


def write_job_record(cluster: str, job) -> None:
    """An islands job's launch, for `rejoin HOST` to start one host's agent again into it."""
    JOBS.mkdir(parents=True, exist_ok=True)
    job_record_path(cluster).write_text(json.dumps({
        "command": job.command, "nproc_per_host": job.nproc_per_host, "max_restarts": job.max_restarts,
        "hosts": len(job.hosts), "run_id": job.run_id, "port": job.port}))


def forget_job_record(cluster: str) -> list[str]:
    """`down`: the cluster's islands job record goes with it; what was removed, as lines to print."""
    path = job_record_path(cluster)
    if not path.exists():
        return []
    path.unlink()
    return [f"file {path}"]


def read_job_record(cluster: str) -> dict:
    path = job_record_path(cluster)
    if not path.exists():
        raise ClusterError(f"no islands job was run on cluster {cluster}: start one with `run -- -m ddp_lab.train "
                           f"... {FAULT_TOLERANT}` first")
    return json.loads(path.read_text())
