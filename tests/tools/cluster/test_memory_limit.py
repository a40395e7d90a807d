"""A memory limit per emulated host (cluster up --mem): what a rank past it sees, and what the job says."""
import subprocess
import sys
import textwrap

import pytest

from ddp_lab.tools.cluster import emulated, memory_limit, running
from ddp_lab.tools.cluster.__main__ import main
from ddp_lab.tools.cluster.launch import in_host
from tests.tools.cluster.conftest import RATE

pytestmark = pytest.mark.system
MiB = 2**20
# Rank 1 fills more memory than its host has, after the process group is up.
FILL_ON_RANK_1 = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    print("ready", flush=True)
    if dist.get_rank() == 1:
        big = torch.ones(1024 * 2**20 // 4)  # 1 GiB, written
    dist.barrier()
""")


def test_a_rank_past_its_hosts_limit_is_named_out_of_memory(cluster_name, tmp_path):
    script = tmp_path / "fill.py"
    script.write_text(FILL_ON_RANK_1)
    with emulated(2, RATE, cluster_name, mem=700 * MiB) as c, running(c, [str(script)], out=None, err=None) as job:
        assert [h.mem_bytes for h in c.hosts] == [700 * MiB] * 2
        rc = job.wait(timeout=120, grace_s=20)
        out = job.output()
        assert memory_limit.oom_kills(c.hosts[1].netns) >= 1 and memory_limit.oom_kills(c.hosts[0].netns) == 0
    assert rc != 0 and out.count("ready") == 2, out
    assert (f"ddp_lab.tools.cluster: {cluster_name}-1 ran out of memory: its limit of 0.68 GiB (cluster up --mem) "
            f"killed 1 process(es) of this job; shard the model state (sync=fsdp") in out, out
    assert f"{cluster_name}-0 ran out of memory" not in out


def test_a_process_in_a_host_reads_its_limit_and_down_removes_it(cluster_name):
    with emulated(1, RATE, cluster_name, mem=900 * MiB) as c:
        probe = ["-c", "from ddp_lab.training.fit_check import mem_available; print(*mem_available(1), sep='|')"]
        out = subprocess.run(in_host(c.hosts[0], [sys.executable, *probe]), capture_output=True, text=True)
        headroom, ranks, what = out.stdout.strip().split("|")
        assert what == "the memory cgroup's limit leaves" and 0 < int(headroom) < 900 * MiB and ranks == "1", out
        folder = memory_limit.folder(c.hosts[0].netns)
        assert (folder / "memory.limit_in_bytes").read_text().strip() == str(900 * MiB)
    assert not folder.exists()


def test_a_bad_size_is_refused_in_one_line(capsys):
    assert main(["up", "--hosts", "2", "--rate", "1gbit", "--mem", "lots", "--name", "ptnever"]) == 2
    assert capsys.readouterr().err == ("ddp_lab.tools.cluster: error: --mem 'lots': give a size with a unit, e.g. "
                                       "--mem 2GiB or --mem 512m\n")


@pytest.mark.parametrize("size,gib", [("10k", "0.00"), ("512m", "0.50")])
def test_a_limit_below_what_a_host_holds_before_any_model_is_refused(capsys, size, gib):
    assert main(["up", "--hosts", "2", "--rate", "1gbit", "--mem", size, "--name", "ptnever"]) == 2
    assert capsys.readouterr().err == (
        f"ddp_lab.tools.cluster: error: --mem {size}: {gib} GiB a host is less than the 0.68 GiB a torchrun agent "
        f"and one worker hold before any model (torch's libraries, the data): give --mem 1g or more\n")
