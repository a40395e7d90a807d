"""How emulated hosts share one machine: threads, the ranks on its cores, its GPUs."""
from ddp_lab.tools.cluster import Cluster, Host, Job, sharing, thread_share
from ddp_lab.tools.cluster.sharing import RANKS_ON_MACHINE_ENV

HOSTS = [Host(f"c-{i}", f"ddplab-c-{i}", f"10.0.0.{i + 1}", None) for i in range(4)]


def environment(monkeypatch, gpu_folders: int, tmp_path, hosts: int = 3, **env):
    """Job.environment() on a machine whose driver lists `gpu_folders` GPUs."""
    for key in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for i in range(gpu_folders):
        (tmp_path / f"0000:00:0{i}.0").mkdir(parents=True)
    monkeypatch.setattr(sharing, "NVIDIA_GPUS", tmp_path if gpu_folders else tmp_path / "absent")
    return Job(Cluster("c", HOSTS), ["-m", "x"], nproc_per_host=2, hosts=hosts).environment()


def test_threads_are_shared_fairly():
    assert [thread_share(w, cores=2) for w in (1, 2, 3, 8)] == [2, 1, 1, 1]
    assert thread_share(4, cores=16) == 4


def test_every_worker_is_told_how_many_ranks_share_the_cores(monkeypatch, tmp_path):
    env, note = environment(monkeypatch, 0, tmp_path)
    assert env[RANKS_ON_MACHINE_ENV] == "6" and "3 host(s) x 2 rank(s)" in note
    assert env["OMP_NUM_THREADS"] == str(thread_share(6)) and "GPU" not in note


def test_hosts_are_told_they_share_the_gpus(monkeypatch, tmp_path):
    # Every host's LOCAL_RANK 0 takes cuda:0: on a GPU machine they share it.
    _, note = environment(monkeypatch, 1, tmp_path)
    assert "every host sees the same 1 GPU(s)" in note and "dist.device=cpu" in note
    # CUDA_VISIBLE_DEVICES decides what the workers see; hidden GPUs are not shared.
    assert "same 2 GPU(s)" in environment(monkeypatch, 1, tmp_path / "a", CUDA_VISIBLE_DEVICES="0,1")[1]
    assert "GPU" not in environment(monkeypatch, 1, tmp_path / "b", CUDA_VISIBLE_DEVICES="")[1]
    assert "GPU" not in environment(monkeypatch, 1, tmp_path / "c", CUDA_VISIBLE_DEVICES="-1")[1]
    assert "same 1 GPU(s)" in environment(monkeypatch, 1, tmp_path / "e", CUDA_VISIBLE_DEVICES="0,-1,2")[1]
    # One host alone shares nothing with another host.
    assert "GPU" not in environment(monkeypatch, 1, tmp_path / "d", hosts=1)[1]
