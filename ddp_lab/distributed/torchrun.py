"""torchrun whose agents leave in order: a multi-node job that succeeded ends quietly.

    python -m ddp_lab.distributed.torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST0:29500 --rdzv_id=NAME -m ddp_lab.train

takes torchrun's arguments and runs torchrun (torch.distributed.run), changed only at the
very end of a job whose workers all ended 0.

Why: with `--rdzv_backend=c10d` one agent serves the rendezvous's TCP store (the agent on
the endpoint's host). When every node's workers have ended, the agents meet at torchrun's
exit barrier, and then each one closes the rendezvous on that store
(DynamicRendezvousHandler.shutdown: a read, and a write where it is still open). The
serving agent closes it first (its store is local) and its process exits, taking the
store with it; an agent still on its way to the store then fails: C++ prints a warning
with some 30 stack frames ("recvValueWithTimeout failed ... Connection was likely closed")
and torch a line ("... has failed to shutdown the rendezvous ... RendezvousConnectionError"),
on a run that succeeded (exit 0, every result written). The further the others (a slow
link, a loaded machine), the likelier. The workers cannot order this: they have all ended
before the exit barrier, so only the agents can.

What changes: after a successful exit barrier, each agent closes the rendezvous as torchrun
does and then counts itself out in the store; the agent that serves the store waits until
every agent has counted out (at most the rendezvous's close timeout, 30 s by default) before
it returns and its process takes the store away. A failed or stopped job, and a torch whose
internals differ from those named below (torch_parts; 2.14 has them), ends as plain torchrun does.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import time

log = logging.getLogger("ddp_lab")

DONE_KEY = "ddp_lab/closed"  # + "/<run id>": how many agents have closed the rendezvous
POLL_S = 0.02  # how often the serving agent counts (a call to its own, local store)

_hosted: list = []  # the rendezvous stores this process serves
_installed = False


def _recording(tcp_store):
    """TCPStore as the c10d backend calls it, noting the stores this process serves."""
    def create(*args, **kwargs):
        store = tcp_store(*args, **kwargs)
        if kwargs.get("is_master", len(args) > 3 and args[3]):
            _hosted.append(store)
        return store
    return create


def count_out(store, run_id: str, agents: int, serving: bool, within_s: float) -> int:
    """This agent's closing, counted in `store`; where it serves the store, wait (at most
    within_s) until `agents` have counted out. Returns how many had."""
    key = f"{DONE_KEY}/{run_id}"
    done = store.add(key, 1)
    deadline = time.monotonic() + within_s
    while serving and done < agents and time.monotonic() < deadline:
        time.sleep(POLL_S)
        done = store.add(key, 0)
    if serving and done < agents:
        log.warning("ddp_lab: %d of %d torchrun agents had not closed the rendezvous after %g s; "
                    "its store goes now", agents - done, agents, within_s)
    return done


def torch_parts():
    """What install() changes, from this torch (None where it lacks one of them): the elastic
    agent's class, the c10d rendezvous backend's module, the rendezvous handler's class."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    except ImportError:
        return None
    named = [(SimpleElasticAgent, "_exit_barrier"), (backend, "TCPStore"), (backend, "_create_tcp_store"),
             (DynamicRendezvousHandler, "shutdown")]
    if not all(hasattr(owner, name) for owner, name in named):
        return None
    return SimpleElasticAgent, backend, DynamicRendezvousHandler


def install() -> bool:
    """Order the agents' rendezvous shutdown in this (agent) process; False where this torch's
    elastic agent lacks what it relies on (then torchrun runs unchanged)."""
    global _installed
    if _installed:
        return True
    parts = torch_parts()
    if parts is None:
        return False
    SimpleElasticAgent, backend, DynamicRendezvousHandler = parts
    exit_barrier, shutdown = SimpleElasticAgent._exit_barrier, DynamicRendezvousHandler.shutdown
    tcp_store = backend.TCPStore

    def exit_barrier_then_note(self):
        exit_barrier(self)  # called only once this node's workers all ended 0
        with contextlib.suppress(AttributeError):  # (another torch: nothing noted, nothing ordered)
            group = self._worker_group
            group.spec.rdzv_handler._ddp_lab_agents = group.group_world_size

    def shutdown_in_order(self):
        closed = shutdown(self)
        agents = getattr(self, "_ddp_lab_agents", 0)
        store, settings = getattr(self, "_store", None), getattr(self, "_settings", None)
        if closed and agents > 1 and store is not None and settings is not None:
            try:
                count_out(store, settings.run_id, agents, any(store is s for s in _hosted),
                          settings.timeout.close.total_seconds())
            except (RuntimeError, ValueError, TimeoutError) as e:  # the store gone: as plain torchrun
                log.warning("ddp_lab: could not count this agent out of the rendezvous: %s",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
        return closed

    backend.TCPStore = _recording(tcp_store)
    SimpleElasticAgent._exit_barrier = exit_barrier_then_note
    DynamicRendezvousHandler.shutdown = shutdown_in_order
    _installed = True
    return True


def main(argv: list[str] | None = None) -> None:
    gc.disable()  # (as ddp_lab.train: the collector would walk the objects torch makes as it imports, again and again)
    install()
    from torch.distributed import run
    gc.freeze()
    gc.enable()
    try:
        run.main(argv)
    finally:
        gc.freeze()  # (nor walk them all once more as the agent exits)


if __name__ == "__main__":
    main()
