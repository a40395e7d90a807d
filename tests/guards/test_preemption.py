"""The save on the way out: one step every rank agrees on, a deadline, a second signal."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from ddp_lab.guards import preemption
from ddp_lab.guards.preemption import Preemption, Terminated
from ddp_lab.telemetry import position
from tests.conftest import free_port
from tests.guards.apart import SLOW_RANK_1, SLOW_STEPS, rank_pids, saves, signal_apart


@pytest.fixture
def handlers():
    """Put SIGTERM's and SIGINT's handlers back after a test installs ours."""
    saved = {s: signal.getsignal(s) for s in preemption.SIGNALS}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_alone_the_step_in_flight_is_saved_and_the_exit_is_143(tmp_path, handlers, caplog):
    p = Preemption(0, 30.0, tmp_path).install()
    assert not p.stop_here(6)  # no signal: never stop
    signal.raise_signal(signal.SIGTERM)  # noted, not raised: the step goes on
    assert p.requested and p.signal == "SIGTERM"
    assert p.stop_here(7) and p.stop_after == 7
    p.report_save(tmp_path / "checkpoints" / "step-7")
    assert p.exit_code == 143
    assert "rank 0: saved checkpoint step-7" in caplog.text
    assert "after SIGTERM to rank 0; exit 143: continue with trainer.resume=auto" in caplog.text


def test_a_second_signal_stops_at_once_with_the_stacks(tmp_path, handlers, capsys, monkeypatch):
    monkeypatch.setattr(preemption, "REPEAT_S", 0.2)
    p = Preemption(1, 30.0, tmp_path).install()
    signal.raise_signal(signal.SIGINT)  # Ctrl-C: the same save as SIGTERM
    signal.raise_signal(signal.SIGINT)  # at once again: from SLURM and torchrun both, one request
    assert p.signal == "SIGINT" and not p.stop_after
    time.sleep(0.3)
    with pytest.raises(Terminated) as e:
        signal.raise_signal(signal.SIGINT)
    p.close()
    assert e.value.code == 130
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL  # a third kills outright
    assert "test_a_second_signal_stops_at_once" in (tmp_path / "stacks" / "rank1.txt").read_text()
    assert "SIGINT (a second time: stopping at once, no save)" in capsys.readouterr().err


def test_preempt_save_s_0_stops_at_once(tmp_path, handlers, capsys):
    Preemption(0, 0.0, tmp_path).install()
    with pytest.raises(Terminated) as e:
        signal.raise_signal(signal.SIGTERM)
    assert e.value.code == 143
    assert "SIGTERM (trainer.preempt_save_s=0: stopping at once, no save)" in capsys.readouterr().err


def test_ranks_agree_on_the_next_step_and_a_rank_without_a_signal_learns_it():
    store = dist.HashStore()
    signalled, other = Preemption(0, 30.0), Preemption(1, 30.0)
    signalled.watch(store, 2)
    other.watch(store, 2)
    try:
        signalled._on_signal(signal.SIGTERM, None)  # what the handler does on SIGTERM
        # after step 10 it proposes 11 and holds there until rank 1's poll has read it
        started = time.monotonic()
        assert not signalled.stop_here(10)
        assert time.monotonic() - started < preemption.ACK_S
        assert store.get(preemption.KEY) == b"11 0 SIGTERM"
        assert other.stop_after == 11 and other.signal is None and other.exit_code == 143
        assert other.proposer == "SIGTERM to rank 0"
        assert not other.stop_here(10) and other.stop_here(11) and signalled.stop_here(11)
        # a later proposal (rank 1 gets its own signal after step 11) keeps the first one
        late = Preemption(1, 30.0)
        late.watch(store, 2)
        late._on_signal(signal.SIGTERM, None)
        assert late.stop_here(11) and late.stop_after == 11
        late.close()
    finally:
        signalled.close()
        other.close()


def test_a_rank_that_never_reads_the_step_stops_the_proposer_at_once(monkeypatch, capsys):
    monkeypatch.setattr(preemption, "ACK_S", 0.5)
    p = Preemption(0, 30.0)
    p.watch(dist.HashStore(), 3)  # ranks 1 and 2 never answer: dead, or stopped
    p._on_signal(signal.SIGTERM, None)
    try:
        with pytest.raises(Terminated) as e:
            p.stop_here(4)
    finally:
        p.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert e.value.code == 143
    assert "ranks 1, 2 did not answer within 0.5 s, dead or stuck" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["in a step", "starting"])
def test_the_deadline_ends_the_process_without_a_save(tmp_path, where):
    """The step never ends (a stuck disk, a dead peer), or never begins (torchrun's SIGTERM to the
    ranks still starting when one failed): out at trainer.preempt_save_s, saying which."""
    code = ("import signal, time\n"
            "from ddp_lab.guards.preemption import Preemption\n"
            "from ddp_lab.telemetry import position\n"
            + ("position.at_step(3); position.phase('forward/backward')\n" if where == "in a step" else "")
            + "Preemption(0, 0.5).install()\n"
            "signal.raise_signal(signal.SIGTERM)\n"
            "time.sleep(30)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert time.monotonic() - started < 15
    said = ("rank 0 stopped at step 3 in forward/backward: the save did not end within trainer.preempt_save_s=0.5 "
            "of SIGTERM" if where == "in a step" else
            "rank 0 stopped at step 0 while starting: SIGTERM came before its first step, and no step came within "
            "trainer.preempt_save_s=0.5: nothing new to save (if another rank failed first, its error says why)")
    assert said + "; exiting without a checkpoint (the previous one is the resume point)" in proc.stderr


def test_without_a_signal_a_step_costs_no_store_access():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"store.{name} called without a signal")

    p = Preemption(0, 30.0)
    p.store, p.world_size = Untouchable(), 2  # watch() without its poll thread
    assert not any(p.stop_here(step) for step in range(1, 1000))


def test_a_signal_after_another_rank_gave_up_exits_at_once_without_a_save(tmp_path):
    """torchrun stops the survivors with SIGTERM when a rank failed: no save can be agreed
    on, so a rank that reads the failure in the store leaves at once."""
    code = ("import signal, sys, time, torch.distributed as dist\n"
            "from ddp_lab.guards import preemption\n"
            "from ddp_lab.guards.watchdog import note_failure\n"
            "preemption.POLL_S = 0.05\n"
            "store = dist.HashStore()\n"
            "p = preemption.Preemption(1, 30.0, sys.argv[1]).install()\n"
            "p.watch(store, 2)\n"
            "note_failure(store, 'rank 0 has waited 20 s in gradient sync at step 4')\n"
            "signal.raise_signal(signal.SIGTERM)\n"
            "time.sleep(30)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert time.monotonic() - started < 15  # not trainer.preempt_save_s=30
    assert ("another rank gave up (rank 0 has waited 20 s in gradient sync at step 4); exiting "
            "without a checkpoint (the previous one is the resume point); stacks in "
            f"{tmp_path / 'stacks' / 'rank1.txt'}") in proc.stderr


def test_closing_stops_the_store_poller(tmp_path, handlers):
    import torch.distributed as dist
    p = Preemption(0, 30.0, tmp_path).install()
    p.watch(dist.HashStore(), 2)
    assert p._poller.is_alive()
    p.close()
    assert not p._poller.is_alive()  # no store call left in flight when the process exits


def test_a_rank_that_learned_the_step_first_still_saves_on_its_own_signal(handlers, caplog, monkeypatch):
    """On many nodes the signals arrive apart: rank 1 reads rank 0's step, then gets its
    own SIGTERM. That is its first signal, not a second: it saves at the agreed step."""
    monkeypatch.setattr(position, "HERE", position.Place())  # at step 0, whatever ran before in this process
    store = dist.HashStore()
    first, second = Preemption(0, 30.0), Preemption(1, 30.0).install()
    first.watch(store, 2)
    second.watch(store, 2)
    try:
        first._on_signal(signal.SIGTERM, None)
        assert not first.stop_here(6)  # proposes 7, held until rank 1's poll read it (5 s at most)
        until = time.monotonic() + 10  # a loaded machine can outlast that hold
        while second.stop_after is None and time.monotonic() < until:
            time.sleep(0.05)
        assert second.stop_after == 7 and second.signal is None
        signal.raise_signal(signal.SIGTERM)  # its own, a second later: noted, no exit
        assert second.signal == "SIGTERM" and second.stop_after == 7
        assert not second.stop_here(6) and second.stop_here(7) and first.stop_here(7)
        second.report_save(None)
        assert second.exit_code == 143
    finally:
        first.close()
        second.close()
    assert "rank 1 got SIGTERM at step 0: saving the checkpoint after step 7 the ranks agreed " \
           "on (SIGTERM to rank 0; a second SIGTERM stops at once)" in caplog.text
    assert "stopping at once" not in caplog.text.replace("a second SIGTERM stops at once", "")


@pytest.mark.system
@pytest.mark.parametrize("apart_s", [0.5, 3.0])
def test_signals_that_reach_the_ranks_apart_save_on_every_rank(tmp_path, apart_s):
    """SIGTERM to rank 0's worker, then to rank 1's `apart_s` after rank 1 read the step to
    stop after: every rank saves at the one agreed step (rank 1 used to stop at once)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "-m", "ddp_lab.train",
           *SLOW_STEPS, f"hydra.run.dir={run_dir}"]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", **SLOW_RANK_1})
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "launches.json").exists() or len(rank_pids(agent.pid)) < 2:
            assert agent.poll() is None and time.monotonic() < deadline, agent.stdout.read()[-3000:]
            time.sleep(0.1)
        signal_apart(rank_pids(agent.pid), run_dir, apart_s)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    saved = saves(run_dir)
    assert sorted(saved) == ["0", "1"] and saved["0"] == saved["1"], out[-3000:]
    assert (run_dir / "checkpoints" / f"step-{saved['0']}" / "meta.json").exists()
