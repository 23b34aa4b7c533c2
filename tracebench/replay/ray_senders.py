"""`replay --ray ADDRESS --senders N`: the sender processes of replay/senders.py as Ray actors on the cluster's nodes.

The router stays here, one process, as on one host. Each `SenderActor` (num_cpus=1, SPREAD over the nodes) runs the
same sender loop as a spawned sender process (`_SenderLoop`: its own asyncio loop and aiohttp session; it builds,
writes and reads the requests it is handed, and sends back their stamps). The transport is still `multiprocessing`:
a `Listener` on this node's address (an authkey drawn per run: its HMAC challenge keeps other clients out) that each
actor connects to with `multiprocessing.connection.Client`, then the same pickled message lists as over a pipe. The
actor's first message names its index.

Clocks: a sender stamps `time.monotonic() - mono_start`. On this node CLOCK_MONOTONIC is one clock for every process
(offset 0, as for spawned senders). On another node it may be another clock: its offset (the actor's time.monotonic()
less this process's) is measured NTP-style before the run, CLOCK_SAMPLES round trips through the actor, the one with
the shortest round trip kept (offset = remote - the midpoint; uncertain by half of that round trip), and, when it is
larger than that uncertainty (another machine: always), the actor is told the run start on its own clock
(mono_start + offset): its stamps are then on the run's clock to within that uncertainty. The offset is measured again at the end (`after`: the drift over the run). run.json senders.actors
keeps node, pid and clock of each.

Faults: each actor's `serve` call returns only when its loop ends; a thread here waits on it and, when it ends,
makes the sender's sentinel readable (a pipe): a node removed or an actor killed is then, as a spawned sender that
died, a fault the run reports (SenderDied naming the node), its requests in flight recorded as errors.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tracebench.cluster.remote import CLOCK_SAMPLES, actor_lost, clock_offset, first_line
from tracebench.replay.senders import START_TIMEOUT_S, SenderDied, SenderHandle, SenderSetup

RAY_CALL_TIMEOUT_S = 30.0


class SenderActor:
    """One sender process on some node (wrapped by `ray.remote` in RaySenders.launch: this module imports no ray)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def node(self) -> dict[str, Any]:
        import ray

        return {"id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    def monotonic(self) -> float:
        return time.monotonic()

    def serve(self, address: tuple[str, int], authkey: bytes, setup: SenderSetup) -> None:
        """Connect to the router and serve it until it says stop or the connection closes."""
        from tracebench.precise_loop import run
        from tracebench.replay.senders import _SenderLoop

        conn = Client(address, authkey=authkey)
        try:
            conn.send(self.index)
            run(_SenderLoop(conn, setup).serve())
        finally:
            conn.close()


class _ActorHandle:
    """A sender actor as the router's SenderHandle: its sentinel turns readable when its `serve` call has ended."""

    def __init__(self, ray: Any, actor: Any, call: Any, node: dict[str, Any], same_node: bool) -> None:
        self.ray, self.actor, self.call, self.node, self.same_node = ray, actor, call, node, same_node
        self.pid: int | None = node["pid"]
        self.exitcode: int | None = None
        self.exit_text: str | None = None
        self._read_end, self._write_end = os.pipe()
        self.sentinel = self._read_end
        self._thread = threading.Thread(target=self._wait, name=f"sender-actor-{node['pid']}", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        where = f"on node {self.node['ip']} ({self.node['id'][:12]})"
        try:
            self.ray.get(self.call)
            self.exit_text, self.exitcode = f"its Ray actor's loop ended {where}", 0
        except self.ray.exceptions.RayActorError as err:  # the node removed, or the actor killed
            self.exit_text, self.exitcode = actor_lost(self.ray, err, where), 1
        except self.ray.exceptions.RayError as err:  # its loop raised (a bug): named
            self.exit_text, self.exitcode = f"failed {where}: {first_line(err)}", 1
        os.write(self._write_end, b"x")

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        self.ray.kill(self.actor)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def close(self) -> None:
        self.ray.kill(self.actor)
        for fd in (self._read_end, self._write_end):
            os.close(fd)


class RaySenders:
    """The launcher of replay/senders.py's ProcessSender for --ray (module docstring)."""

    placement = "Ray actors, num_cpus=1, SPREAD over the nodes"

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.handles: list[_ActorHandle] = []
        self.clocks: list[dict[str, Any]] = []

    async def launch(self, count: int, setup: SenderSetup) -> list[tuple[SenderHandle, Connection]]:
        ray = self.ray
        this_node = ray.get_runtime_context().get_node_id()
        authkey = os.urandom(32)
        listener = Listener((ray.util.get_node_ip_address(), 0), authkey=authkey)
        actor = ray.remote(SenderActor).options(num_cpus=1, max_concurrency=3, scheduling_strategy="SPREAD")
        actors = [actor.remote(i) for i in range(count)]
        try:
            nodes = await asyncio.to_thread(ray.get, [a.node.remote() for a in actors], timeout=START_TIMEOUT_S)
            calls = [a.serve.remote(listener.address, authkey, setup) for a in actors]
            conns = await _accept(listener, count)
        except BaseException:
            for a in actors:
                ray.kill(a)
            raise
        finally:
            listener.close()
        for a, call, node in zip(actors, calls, nodes):
            self.handles.append(_ActorHandle(ray, a, call, node, node["id"] == this_node))
        self.clocks = [await asyncio.to_thread(self._measure_clock, i) for i in range(count)]
        return [(handle, conns[i]) for i, handle in enumerate(self.handles)]

    def _measure_clock(self, index: int) -> dict[str, Any]:
        """Sender `index`'s monotonic clock against this process's (module docstring)."""
        handle = self.handles[index]
        # another machine's monotonic clock counts from its own boot (an offset of seconds or days: always applied);
        # Ray nodes on one machine share this one (an offset within the uncertainty: left at 0, exact)
        round_trip, offset, applied = clock_offset(
            lambda: self.ray.get(handle.actor.monotonic.remote(), timeout=RAY_CALL_TIMEOUT_S), time.monotonic,
            handle.same_node)
        return {"same_node": handle.same_node, "offset_s": offset, "uncertainty_s": round_trip / 2,
                "applied_offset_s": applied, "after": None}

    def clock_offset(self, index: int) -> float:
        return self.clocks[index]["applied_offset_s"]

    def describe(self) -> dict[str, Any]:
        return {
            "placement": self.placement,
            "transport": "multiprocessing connections over TCP (Listener / Client, a per-run authkey), then "
                         "asyncio transports on their sockets: pickled message lists in multiprocessing's framing",
            "clock": "each sender stamps time.monotonic() - the run start on its own clock: mono_start + its offset "
                     f"(0 on this node; elsewhere measured, the shortest of {CLOCK_SAMPLES} round trips kept)",
            "actors": [{"node": {k: h.node[k] for k in ("id", "ip", "hostname")}, "pid": h.pid,
                        "same_host": h.same_node, "clock": clock, "ended": h.exit_text}
                       for h, clock in zip(self.handles, self.clocks)],
        }

    def close(self) -> None:
        """Each sender's clock measured again (the drift over the run), then the actors freed."""
        for index, handle in enumerate(self.handles):
            if handle.exitcode != 1 and index < len(self.clocks):  # not lost (its loop may have ended: it stopped)
                try:
                    self.clocks[index]["after"] = self._measure_clock(index)["offset_s"]
                except self.ray.exceptions.RayError as err:
                    self.clocks[index]["after"] = f"not measured: {first_line(err)}"
        for handle in self.handles:
            handle.close()


async def _accept(listener: Listener, count: int) -> dict[int, Connection]:
    """`count` connections from the sender actors, by the index each sends first; SenderDied when they do not all
    come within START_TIMEOUT_S (the listener is closed then, which ends the waiting thread)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    conns: dict[int, Connection] = {}

    def accept_all() -> None:
        try:
            while len(conns) < count:
                conn = listener.accept()
                conns[conn.recv()] = conn
        except BaseException as err:  # the listener closed on the timeout, or a handshake failed
            # (bound now: Python unbinds `err` when this block ends, before the loop runs the callback)
            loop.call_soon_threadsafe(lambda failed=err: done.done() or done.set_exception(failed))
            return
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=accept_all, name="sender-accept", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), START_TIMEOUT_S)
    except asyncio.TimeoutError:
        listener.close()
        raise SenderDied(f"{count - len(conns)} of {count} sender actor(s) did not connect within "
                         f"{START_TIMEOUT_S:g} s") from None
    return conns
