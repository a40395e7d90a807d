"""ddp_lab.distributed.torchrun: the agent that serves the c10d rendezvous's store leaves last,
so a multi-node run that succeeded ends without a C++ stack on another agent's stderr."""
import datetime
import logging
import threading
import time
import uuid

import pytest
import torch.distributed as dist

from ddp_lab.distributed import torchrun
from tests.conftest import free_port
from tests.distributed.agents import ORDERED, TORCHRUN, agent_command, agent_env, late_close, noise, run_agents


def _stores():
    port = free_port()
    timeout = datetime.timedelta(seconds=10)
    served = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timeout, wait_for_workers=False)
    return served, dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


def test_the_serving_agent_waits_until_every_agent_has_counted_out():
    served, other = _stores()
    got, t0 = {}, time.monotonic()
    waiting = threading.Thread(target=lambda: got.update(done=torchrun.count_out(served, "job", 2, True, 10),
                                                         at=time.monotonic() - t0))
    waiting.start()
    time.sleep(0.5)
    assert waiting.is_alive()  # the store stays while the other agent has not closed
    assert torchrun.count_out(other, "job", 2, False, 10) == 2  # the other returns at once
    waiting.join(timeout=5)
    assert got["done"] == 2 and 0.5 <= got["at"] < 3


def test_the_serving_agent_leaves_after_the_close_timeout_saying_who_had_not(caplog):
    served, _ = _stores()
    caplog.set_level(logging.WARNING, logger="ddp_lab")
    t0 = time.monotonic()
    assert torchrun.count_out(served, "job", 3, True, 0.3) == 1
    assert 0.3 <= time.monotonic() - t0 < 2
    assert "2 of 3 torchrun agents had not closed the rendezvous after 0.3 s" in caplog.text


def test_this_torch_has_what_the_ordered_end_changes():
    assert torchrun.torch_parts() is not None  # else ddp_lab.distributed.torchrun runs as plain torchrun


def _late_two_nodes(tmp_path, runner, entry):
    """Two agents; the one that does not serve the store closes the rendezvous 2 s late."""
    port, rdzv_id = free_port(), f"quiet-{uuid.uuid4().hex[:8]}"
    late = late_close(tmp_path / "late", 2)
    return run_agents([(agent_command(runner, port, rdzv_id, True, entry), agent_env()),
                       (agent_command(runner, port, rdzv_id, False, entry), agent_env(late))], tmp_path)


@pytest.mark.system
def test_plain_torchrun_prints_a_cpp_stack_when_the_store_leaves_first(tmp_path):
    # the root cause, as torch 2.4-2.14 has it: when this fails, torch orders the end itself
    (rc0, _, err0), (rc1, _, err1) = _late_two_nodes(tmp_path, TORCHRUN, ["--no-python", "true"])
    assert (rc0, rc1) == (0, 0)
    assert noise(err0) == []
    assert "failed to shutdown the rendezvous" in err1 and "RendezvousConnectionError" in err1
    assert "frame #" in err1  # the C++ stack of the store's client


@pytest.mark.system
def test_ordered_agents_end_quietly_when_one_closes_late(tmp_path):
    results = _late_two_nodes(tmp_path, ORDERED, ["--no-python", "true"])
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
        assert noise(err) == [], err[-3000:]
