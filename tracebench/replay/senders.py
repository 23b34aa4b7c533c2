"""Parallel senders on one host (`--senders N`, N > 1): the per-request work that decides nothing can run in N
sender processes; the router stays one.

The router process keeps the queue, the policies, caps, every decision and the records (router.py); `ProcessSender`
is its `Sender` (flight.py). A request handed over goes (request id, the server's URL, input_len / output_len /
prefix blocks) to the sender process with the fewest requests in flight. That process rebuilds the body itself
(`InputIds`: the same trace sha256, vocabulary and block size give the same ids), writes it, reads the stream and
parses the answer with today's `HttpSender` in its own asyncio loop and aiohttp session, and sends back the stamps
(t_built, t_dispatch, t_written, t_headers, t_first_token, t_last_chunk, t_finish, the inter-token gaps) with the
final Answer. The router reads the answer into the record, checks it and writes it, once, as with one process.

The router sends what it can (`Split`): a hop to another process costs a wake-up there, ~0.05 ms on an idle core and
0.5-1.5 ms on a host whose cores are all busy (bench/bench_senders.py on 2 shared cores); the work it saves the
router is ~0.2-0.3 ms a request. So the router keeps sending requests itself (HttpSender, its own session) while it
keeps up, and hands a growing share over only while it is behind (more than a quarter of the recent requests late
by --router-sends-under, 1 ms by default) and a CPU the sender processes may use is idle (/proc/stat, `IdleCores`). `--router-sends-under 0` hands
every request over. run.json `senders` counts who carried how many.

Transport: a `multiprocessing` duplex pipe per sender process (spawned, not forked: the router's loop and threads are
never copied), read and written by an asyncio transport on each end (`Channel`: multiprocessing's framing, a 4-byte
length and a pickled list of messages): a write never blocks the loop (two ends that wrote to each other at once with
blocking sends deadlocked), and what one loop turn has for a process goes as one list (the router flushes the requests
of an assignment round when the round is over; a sender process, its answers at the end of its loop turn). Router ->
sender: ("clock", mono_start, wall_start), ("go", id, url, input_len, output_len, blocks), ("cancel", id), ("stop",).
Sender -> router: ("ready", pid), ("progress", [(id, t_progress, t_first_token), ...]) every PROGRESS_PERIOD_S for
the requests whose stream moved (the watchdog's input), ("done", id, stamps, status, error, meta, connection_lost)
(meta: only the meta_info keys the router reads, client.METAINFO_READ), ("raised", id, stamps, error type, message)
for an answer that broke the contract (ServerProtocolError: the run stops, as with one process), ("cancelled", id,
stamps).

The router's side per request, when every request is handed over (`--router-sends-under 0`): no task and no
coroutine of its own (`take_over`: the sender process carries the whole flight, and the router reads its answer and
writes its record in one call back, `on_end`); with the split, a task per request awaits `exchange`, as with one
process. run.json `senders.router_cpu_s` is the router process's CPU over the run (bench/bench_senders.py divides it
by the requests).

One clock: on one host CLOCK_MONOTONIC is the same clock in every process, so each sender process stamps with
`time.monotonic() - mono_start` of the router's RunClock (sent to it when the run clock starts, before any request);
it converts nothing: sglang's wall-clock stamps stay in meta_info and the router converts them with its
`wall_start`. A stamp taken in a sender process is therefore on the run's one clock, as exact as one taken in the
router; only progress reaches the router's watchdog up to PROGRESS_PERIOD_S late (its bounds are seconds).

A sender process that dies (killed, out of memory) is a fault of tracebench itself, not of the servers: its requests
in flight end as `error` ("SenderDied: sender process k (pid p) died: ..."), and the run stops, status failed (the
rest are recorded cancelled / not_sent, as for any run that stops). Continuing would measure a load that lost part
of its requests for a reason outside the system under test. Cancelling (Ctrl-C, a saturation stop, the watchdog)
asks the sender process to cancel the request and waits for its stamps, so a cancelled record says truly whether
the request went out (`t_dispatch`). Sender processes ignore SIGINT and SIGTERM (the router decides how the run
ends and tells them) and end when their pipe closes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from multiprocessing.connection import Connection
from typing import Any, Protocol

from tracebench.errors import RunFailed, ServerProtocolError, TracebenchError
from tracebench.replay.client import APIS, METAINFO_READ, Answer, Api, SglangClient
from tracebench.replay.flight import HttpSender, Progress
from tracebench.replay.records import RequestRecord
from tracebench.replay.tokens import InputIds
from tracebench.trace.format import TraceRequest

PROGRESS_PERIOD_S = 0.1  # a sender process reports stream progress this often (the watchdog's bounds are seconds)
START_TIMEOUT_S = 60.0  # a sender process must be ready within this (it imports aiohttp and numpy)
STOP_TIMEOUT_S = 5.0  # a sender process told to stop must exit within this, else it is killed
CANCEL_TIMEOUT_S = 10.0  # a sender process told to cancel a request must answer within this (else SenderFailed)
MAX_SENDERS = 256

# the stamps a sender process takes on a record, in this order on the pipe
STAMP_FIELDS = ("t_built", "t_dispatch", "t_written", "t_headers", "t_first_token", "t_last_chunk", "t_finish",
                "itl_max", "itl_hist")
_EAGER = sys.version_info >= (3, 12)


class SenderDied(RunFailed):
    """A sender process ended while the run needed it (killed, out of memory, crashed)."""


class SenderFailed(RunFailed):
    """A sender process met an error that is not a measurement (a bug, or a broken contract it could not name)."""


@dataclass(frozen=True)
class SenderSetup:
    """What every sender process needs (pickled to it at start). The run clock comes later, by message ("clock",
    mono_start, wall_start): the processes start before the run clock does, so that their start-up is not run time."""

    trace_sha: str
    vocab: int
    block_size: int | None
    api: str
    cache_reported: bool
    stream: bool
    request_timeout: float | None
    timeout_reason: str | None
    keepalive: float
    cpus: tuple[int, ...] | None  # --pin-cpus: the CPUs the sender processes run on (None: wherever the host puts them)


async def start_senders(count: int, trace_sha: str, vocab: int, block_size: int | None, api: Api,
                        client: SglangClient, keepalive: float, sends_under: float,
                        cpus: tuple[int, ...] | None = None, launcher: Launcher | None = None) -> ProcessSender:
    """Start `count` sender processes speaking like `client` (its API, streaming, timeout) with its keep-alive, on
    `cpus` if given (--pin-cpus), started by `launcher` if given (--ray: as actors on the cluster's nodes); the router
    sends a request itself through `client` when its own time so far is under `sends_under` (0: never)."""
    setup = SenderSetup(trace_sha, vocab, block_size, api.name, api.cache_reported, client.stream,
                        client.request_timeout, client.timeout_reason, keepalive, cpus)
    local = HttpSender(client, InputIds(trace_sha, vocab, block_size)) if sends_under > 0 else None
    sender = ProcessSender(count, setup, api, client.stream, local, sends_under, launcher)
    try:
        await sender.start()
    except BaseException:
        await sender.close()
        raise
    return sender


# ---- the connection: multiprocessing's framing on an asyncio transport ----------------------------------------


class Channel(asyncio.Protocol):
    """One end of a sender's connection, on the event loop: the bytes multiprocessing.Connection puts on the wire (a
    4-byte big-endian length, then a pickle of the message list) through an asyncio transport, so that

    - a send never blocks the loop: the transport keeps what the socket does not take yet and writes it when the
      socket drains (Connection.send blocks: a router and a sender process that both wrote while the other was
      writing too each waited on a full socket buffer forever, seen at 1,000 req/s on 2 busy cores);
    - everything that arrived is read in one `data_received`, every whole message list in it handed on at once (no
      poll() per message: multiprocessing's wait() makes a selector for each call).

    `on_messages(list)` gets each message list in order; an exception it raises closes the channel (and is the
    channel with it). `on_closed(failure)` once, when the other end closed or the connection broke (failure None),
    or when a message could not be read or handled (failure: that error)."""

    def __init__(self, on_messages: Callable[[list[tuple[Any, ...]]], None],
                 on_closed: Callable[[BaseException | None], None]) -> None:
        self.on_messages = on_messages
        self.on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.closed = False
        self.failure: BaseException | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done when closed

    @classmethod
    async def over(cls, conn: Connection, on_messages: Callable[[list[tuple[Any, ...]]], None],
                   on_closed: Callable[[BaseException | None], None]) -> Channel:
        """A channel over the socket of `conn` (a duplex Pipe's end, or a Listener / Client connection: a socket
        either way), which it takes over (`conn` is closed; the socket lives on in the channel)."""
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        sock.setblocking(False)
        channel = cls(on_messages, on_closed)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: channel, sock)
        return channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        size = len(buf)
        pos = 0
        try:
            while size - pos >= 4:
                length = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
                end = pos + 4 + length
                if length < 0:  # multiprocessing's mark of a message over 2 GiB: never one of ours
                    raise SenderFailed(f"sender connection: a message length of {length}")
                if end > size:
                    break
                msgs = pickle.loads(buf[pos + 4:end])
                pos = end
                self.on_messages(msgs)
        except Exception as err:  # a broken message or a bug handling one: the channel closes with it (on_closed)
            self.failure = err
            assert self.transport is not None
            self.transport.abort()
            return
        del buf[:pos]

    def eof_received(self) -> bool:
        return False  # the transport closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.closed:
            self.closed = True
            self.on_closed(self.failure)

    def send(self, msgs: list[tuple[Any, ...]]) -> bool:
        """Queue one message list (written at once if the socket takes it); False if the channel is closed."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        data = pickle.dumps(msgs, pickle.HIGHEST_PROTOCOL)
        self.transport.write(len(data).to_bytes(4, "big", signed=True) + data)
        return True

    def close(self) -> None:
        """Close after what is queued was written."""
        if self.transport is not None:
            self.transport.close()


# ---- the sender process ----------------------------------------------------------------------------------------


class _Server:
    """What HttpSender needs of a server in a sender process."""

    __slots__ = ("generate_url", "t_heard")

    def __init__(self, url: str) -> None:
        self.generate_url = url
        self.t_heard = 0.0


class _Flight:
    __slots__ = ("t_progress",)

    def __init__(self) -> None:
        self.t_progress = 0.0


def sender_main(conn: Connection, setup: SenderSetup) -> None:
    """A sender process's body: serve the router's assignments until it says stop or its pipe closes."""
    # Ctrl-C and SIGTERM reach the whole process group: the router decides how the run ends and tells this process
    # (cancel, stop); a sender that died of the signal first would turn an interruption into a fault
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if setup.cpus is not None:  # --pin-cpus: off the router's core (a wake-up there would preempt it)
        os.sched_setaffinity(0, setup.cpus)
    from tracebench.precise_loop import run

    run(_SenderLoop(conn, setup).serve())


class _SenderLoop:
    def __init__(self, conn: Connection, setup: SenderSetup) -> None:
        self.conn = conn  # until serve() puts it on the loop (self.channel)
        self.setup = setup
        self.mono_start: float | None = None  # the router's RunClock, when its ("clock", ...) message came
        self.tasks: dict[int, tuple[asyncio.Task[None], RequestRecord, _Flight]] = {}
        self.outbox: list[tuple[Any, ...]] = []
        self.flush_handle: asyncio.Handle | None = None
        self.fatal: BaseException | None = None
        self.stopped: asyncio.Event | None = None

    def now(self) -> float:
        return time.monotonic() - self.mono_start  # type: ignore[operator]

    async def serve(self) -> None:
        setup = self.setup
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.stopped = asyncio.Event()
        self.busy = asyncio.Event()  # requests are in flight here (the progress reports run)
        api = APIS[setup.api]()
        api.cache_reported = setup.cache_reported
        client = SglangClient(setup.request_timeout, setup.stream, setup.timeout_reason, api=api,
                              keepalive=setup.keepalive)
        self.sender = HttpSender(client, InputIds(setup.trace_sha, setup.vocab, setup.block_size))
        self.servers: dict[str, _Server] = {}
        self.channel = await Channel.over(self.conn, self._received, self._closed)
        self._post(("ready", os.getpid()))
        ticker = loop.create_task(self._progress_ticks())
        try:
            await self.stopped.wait()
        finally:
            ticker.cancel()
            for task, _, _ in list(self.tasks.values()):
                task.cancel()
            pending = [t for t, _, _ in self.tasks.values()] + [ticker]
            await asyncio.wait(pending)
            self._flush()
            self.channel.close()  # after what is queued was written: waited for below, at most STOP_TIMEOUT_S
            await asyncio.wait([self.channel.lost], timeout=STOP_TIMEOUT_S)
            await client.close()
        if self.fatal is not None:
            raise self.fatal  # the process ends with its traceback; the router reports it as a sender that died

    def _received(self, msgs: list[tuple[Any, ...]]) -> None:
        # a request whose cancel came in the same list as its "go" (this process was slow to turn its loop) is never
        # started: on Python 3.12 its task would start at once (eager) and stamp t_dispatch before the cancel is read
        cancelled = {msg[1] for msg in msgs if msg[0] == "cancel"} if len(msgs) > 1 else None
        for msg in msgs:
            if cancelled and msg[0] == "go" and msg[1] in cancelled:
                rec = RequestRecord(msg[1], msg[3], msg[4], 0.0)
                rec.t_finish = self.now()
                self._post(("cancelled", msg[1], _stamps(rec)))
                continue
            self._handle(msg)

    def _closed(self, failure: BaseException | None) -> None:
        """The router is gone (nothing to send to, nothing to record), or a message broke this process (a bug: it
        stops with it)."""
        if failure is not None and self.fatal is None:
            self.fatal = failure
        assert self.stopped is not None
        self.stopped.set()

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "clock":
            self.mono_start = msg[1]
        elif kind == "go":
            if self.mono_start is None:
                raise SenderFailed("sender process: a request came before the run clock")
            _, rid, url, input_len, output_len, blocks = msg
            server = self.servers.get(url)
            if server is None:
                server = self.servers[url] = _Server(url)
            rec = RequestRecord(rid, input_len, output_len, 0.0)
            flight = _Flight()
            coro = self._exchange(rec, server, flight, blocks)
            if _EAGER:
                task = asyncio.Task(coro, loop=self.loop, eager_start=True)
            else:
                task = self.loop.create_task(coro)
            if not task.done():
                self.tasks[rid] = (task, rec, flight)
                task.add_done_callback(partial(self._task_done, rid))
                self.busy.set()
        elif kind == "cancel":
            entry = self.tasks.get(msg[1])
            if entry is not None:
                entry[0].cancel()
        elif kind == "stop":
            assert self.stopped is not None
            self.stopped.set()
        else:
            raise SenderFailed(f"sender process: unknown message {kind!r}")

    def _task_done(self, rid: int, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never entered `_exchange` (its "cancel" was read in the same batch
        as its "go": a sender process slow to turn its loop), so it is still listed: it answers here, or the router
        would wait for its answer forever (every other way out of `_exchange` unlists it and answers)."""
        entry = self.tasks.get(rid)
        if entry is None or entry[0] is not task:
            return
        del self.tasks[rid]
        rec = entry[1]
        if rec.t_finish is None:
            rec.t_finish = self.now()
        self._post(("cancelled", rid, _stamps(rec)))

    async def _exchange(self, rec: RequestRecord, server: _Server, flight: Progress, blocks: tuple[int, ...] | None) -> None:
        rid = rec.id
        try:
            answer = await self.sender.exchange(rec, server, flight, blocks, self.now)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            if rec.t_finish is None:
                rec.t_finish = self.now()
            self._post(("cancelled", rid, _stamps(rec)))
            return
        except TracebenchError as err:  # a broken contract (ServerProtocolError): the router stops the run with it
            self._post(("raised", rid, _stamps(rec), type(err).__name__, str(err)))
            return
        except Exception as err:  # a bug: named, and the router stops the run with it
            self._post(("raised", rid, _stamps(rec), type(err).__name__, repr(err)))
            return
        finally:
            self.tasks.pop(rid, None)
        # sent with the others of this loop turn: one write for them all (the record's stamps are taken already); of
        # meta_info only what the router reads
        meta = answer.meta
        if meta is not None:
            meta = {key: meta[key] for key in METAINFO_READ if key in meta}
        self._post(("done", rid, _stamps(rec), answer.status, answer.error, meta, answer.connection_lost))

    async def _progress_ticks(self) -> None:
        """Every PROGRESS_PERIOD_S: the requests whose stream moved since the last report (their last progress and
        first token), so that the router's watchdog sees them alive."""
        reported: dict[int, float] = {}
        while True:
            if not self.tasks:  # an idle sender process does not wake up (its host's cores may be busy)
                self.busy.clear()
                await self.busy.wait()
            await asyncio.sleep(PROGRESS_PERIOD_S)
            tasks = self.tasks
            moved = [(rid, flight.t_progress, rec.t_first_token) for rid, (_, rec, flight) in tasks.items()
                     if flight.t_progress and reported.get(rid) != flight.t_progress]
            reported = {rid: flight.t_progress for rid, (_, _, flight) in tasks.items()}
            if moved:
                self._post(("progress", moved))

    def _post(self, msg: tuple[Any, ...]) -> None:
        self.outbox.append(msg)
        if self.flush_handle is None:
            self.flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_handle = None
        if self.outbox:
            out, self.outbox = self.outbox, []
            if not self.channel.send(out):  # the router is gone
                assert self.stopped is not None
                self.stopped.set()


SPLIT_ALPHA = 0.05  # the share of late requests: a moving average over the last ~20 requests
SPLIT_LATE = 0.25  # the router is behind while more than this share of the requests is late at the hand-over
SPLIT_GAIN = 0.05  # how fast the share handed over moves (from none to all in ~20 requests)
SPARE_CORES = 1.0  # idle cores (over the last IDLE_PERIOD_S) below which a sender process has no core to run on
IDLE_PERIOD_S = 0.25


class Split:
    """Which requests the router hands to the sender processes; the rest it sends itself (HttpSender).

    A request is late when tracebench's own time on it up to the hand-over (`own_so_far`) is above `target` seconds.
    While the router is behind (more than SPLIT_LATE of the recent requests late, a moving average) and the host has
    a spare core (`idle_cores`, measured by the caller: more than SPARE_CORES idle), the share handed over grows;
    otherwise it shrinks. So an idle router hands nothing over (a hop to another process costs more than it saves:
    docs/overhead.md), and a router behind on a host whose cores are all busy keeps sending itself: there a sender
    process would only wait for a core, and take it from the router and the servers. The share is applied
    deterministically (every 1/share-th request, no random draw)."""

    __slots__ = ("target", "late", "share", "_due", "idle_cores")

    def __init__(self, target: float) -> None:
        self.target = target
        self.late = 0.0
        self.share = 0.0
        self._due = 0.0
        self.idle_cores: float | None = None  # the host's idle cores lately (None: not measured, taken as spare)

    def hand_over(self, own: float) -> bool:
        """Whether the request whose own time so far is `own` goes to a sender process."""
        self.late += SPLIT_ALPHA * ((own > self.target) - self.late)
        spare = self.idle_cores is None or self.idle_cores > SPARE_CORES
        step = SPLIT_GAIN if self.late > SPLIT_LATE and spare else -SPLIT_GAIN
        self.share = min(1.0, max(0.0, self.share + step))
        self._due += self.share
        if self._due >= 1.0:
            self._due -= 1.0
            return True
        return False


class IdleCores:
    """The idle cores among `cpus` over the last interval, from /proc/stat's per-CPU lines (Linux; None elsewhere: not
    measured). `cpus`: the CPUs the sender processes may run on (their --pin-cpus, or this process's affinity): on a
    host whose other cores are idle but not ours (taskset, a cpuset), the whole machine's idle time said "spare" and
    the router handed requests to processes that could only take its own cores."""

    def __init__(self, cpus: Iterable[int]) -> None:
        self._names = {f"cpu{c}".encode() for c in cpus}
        self.cores = len(self._names)
        self._last = self._read()

    def _read(self) -> tuple[int, int] | None:
        """(idle + iowait jiffies, all jiffies) summed over `cpus`, or None without /proc/stat."""
        try:
            with open("/proc/stat", "rb") as fh:  # a procfs read: no disk, never blocks
                lines = fh.read().split(b"\n")
        except FileNotFoundError:
            return None
        idle = total = 0
        for line in lines[1:]:  # the first line sums every CPU of the host
            fields = line.split()
            if not fields or not fields[0].startswith(b"cpu"):
                break  # the per-CPU lines come first, together
            if fields[0] in self._names:
                ticks = [int(v) for v in fields[1:9]]  # user..steal (guest time is counted in user already)
                idle += ticks[3] + ticks[4]
                total += sum(ticks)
        return idle, total

    def sample(self) -> float | None:
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return self.cores * (now[0] - last[0]) / (now[1] - last[1])


def own_so_far(rec: RequestRecord, now: float) -> float:
    """tracebench's own time on `rec` until `now`: since its arrival, less the waits the run asked for (the client
    gate's, the wait for a free slot, the wait for a static batch), as keepup.py counts the own time before the wire."""
    gate = rec.t_admitted - rec.t_released if rec.t_admitted is not None and rec.t_released is not None else 0.0
    waits = gate + (rec.slot_wait_s or 0.0) + (rec.batch_wait_s or 0.0)
    return now - rec.t_arrival - waits


def _stamps(rec: RequestRecord) -> tuple[Any, ...]:
    return tuple(getattr(rec, name) for name in STAMP_FIELDS)


# ---- the router's side -----------------------------------------------------------------------------------------


class _Pending:
    """A request handed to a sender process, until its answer: awaited (`future`: exchange), or called back (`on_end`:
    take_over; `cancel_timer` while its cancel is awaited)."""

    __slots__ = ("rec", "server", "flight", "worker", "future", "on_end", "cancel_timer")

    def __init__(self, rec: RequestRecord, server: Any, flight: Progress, worker: _Worker,
                 future: asyncio.Future[Answer | None] | None,
                 on_end: Callable[[Answer | None, BaseException | None], None] | None = None) -> None:
        self.rec, self.server, self.flight, self.worker, self.future = rec, server, flight, worker, future
        self.on_end = on_end
        self.cancel_timer: asyncio.TimerHandle | None = None


_in_flight = attrgetter("in_flight")  # a sender process's requests in flight (min() by it: no Python frame a call)


class _Worker:
    """One sender process as the router sees it."""

    __slots__ = ("index", "process", "conn", "channel", "pid", "in_flight", "carried", "outbox", "alive", "reported",
                 "ready")

    def __init__(self, index: int, process: SenderHandle, conn: Connection) -> None:
        self.index = index
        self.process = process
        self.conn = conn  # until start() puts it on the loop (channel)
        self.channel: Channel | None = None
        self.pid: int | None = process.pid
        self.in_flight = 0
        self.carried = 0  # requests handed to it
        self.outbox: list[tuple[Any, ...]] = []
        self.alive = True  # its pipe is open: assignments may go to it
        self.reported = False  # its exit was seen (_died)
        self.ready: asyncio.Future[None] | None = None


class SenderHandle(Protocol):
    """What the router needs of a sender process however it was started: a spawned process here
    (multiprocessing.Process) or a Ray actor on some node (replay/ray_senders.py)."""

    pid: int | None
    sentinel: int  # a descriptor that turns readable when the process has ended
    exitcode: int | None  # None while it runs (and, for a spawned process, until the kernel has it)
    exit_text: str | None  # how it ended, in words (None while it runs)

    def is_alive(self) -> bool: ...
    def kill(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


class _Spawned:
    """A sender process spawned on this host, as a SenderHandle."""

    def __init__(self, process: Any) -> None:  # a multiprocessing (spawn context) Process, started
        self.process = process
        self.pid: int | None = process.pid
        self.sentinel: int = process.sentinel

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    @property
    def exit_text(self) -> str | None:
        code = self.process.exitcode
        if code is None:
            return None
        return f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        self.process.kill()

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)


class Launcher(Protocol):
    """Starts sender processes somewhere else than this host's spawn (`--ray`: replay/ray_senders.py)."""

    placement: str  # run.json senders.placement

    async def launch(self, count: int, setup: SenderSetup) -> list[tuple[SenderHandle, Connection]]:
        """`count` sender processes, each serving `setup` over its connection (index i: the i-th)."""
        ...

    def clock_offset(self, index: int) -> float:
        """Sender `index`'s CLOCK_MONOTONIC less this process's (0 on this host: one clock)."""
        ...

    def describe(self) -> dict[str, Any]:
        """run.json senders: where each sender runs and how its clock was aligned."""
        ...

    def close(self) -> None:
        """Free what `launch` took (after every sender stopped or was killed)."""
        ...


class ProcessSender:
    """The router's Sender when the work of the requests runs in N sender processes (module docstring)."""

    def __init__(self, count: int, setup: SenderSetup, api: Api, stream: bool, local: HttpSender | None = None,
                 sends_under: float = 0.0, launcher: Launcher | None = None) -> None:
        """`local`: the router's own HttpSender, which carries a request itself when the request's own time so far
        (own_so_far) is under `sends_under` run seconds (module docstring, "the router sends what it can"); None or
        0.0: every request goes through a sender process. `launcher`: where the sender processes run (None: spawned
        on this host)."""
        if not 1 <= count <= MAX_SENDERS:
            raise ValueError(f"sender processes: 1..{MAX_SENDERS}, got {count}")
        self.count = count
        self.setup = setup
        self.api = api
        self.stream = stream
        self.local = local if sends_under > 0 else None
        self.sends_under = sends_under
        # the body of the next arrival is made ahead (as with one process) only where the router may send it itself
        self.prepares_ahead = self.local is not None
        # every request handed over: the router gives each whole flight to take_over (no task of its own per request);
        # else exchange() decides per request whether the router carries it itself
        self.take_over = self._take_over if self.local is None else None
        self.carried_here = 0  # requests the router carried itself
        self.split = Split(sends_under)
        self._idle_task: asyncio.Task[None] | None = None
        self._cpu_start: float | None = None
        self.router_cpu_s: float | None = None
        self.workers: list[_Worker] = []
        self._alive: list[_Worker] = []  # the workers whose connection is open: assignments go to these
        self._dirty: list[_Worker] = []  # the workers with messages queued (outbox), in the order queued
        self._flush_handle: asyncio.Handle | None = None
        self._pending: dict[int, _Pending] = {}
        self._closing = False
        # the run's failure handler (router.fail), told at once when a sender process dies
        self.on_fault: Callable[[BaseException], None] | None = None
        self.fault: BaseException | None = None
        self.launcher = launcher

    # ---- start and stop ----

    async def start(self) -> None:
        """Start the sender processes (spawned here, or by the launcher) and wait until each is ready (SenderDied if
        one is not)."""
        loop = self._loop = asyncio.get_running_loop()
        if self.launcher is None:
            ctx = multiprocessing.get_context("spawn")
            started: list[tuple[SenderHandle, Connection]] = []
            for index in range(self.count):
                mine, theirs = ctx.Pipe(duplex=True)
                process = ctx.Process(target=sender_main, args=(theirs, self.setup),
                                      name=f"tracebench-sender-{index}", daemon=True)
                process.start()
                theirs.close()
                started.append((_Spawned(process), mine))
        else:
            started = await self.launcher.launch(self.count, self.setup)
        for index, (process, mine) in enumerate(started):
            worker = _Worker(index, process, mine)
            worker.ready = loop.create_future()
            self.workers.append(worker)
            worker.channel = await Channel.over(mine, partial(self._received, worker), partial(self._pipe_closed, worker))
            self._alive.append(worker)
            loop.add_reader(process.sentinel, self._died, worker)
        # the spare-core rule reads this host's cores: sender processes on a cluster's nodes do not run on them
        if self.local is not None and self.launcher is None:
            self._idle_task = loop.create_task(self._watch_idle())
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready for w in self.workers if w.ready is not None)),
                                   START_TIMEOUT_S)
        except asyncio.TimeoutError:
            late = [w.index for w in self.workers if w.ready is not None and not w.ready.done()]
            raise SenderDied(f"sender process(es) {late} not ready within {START_TIMEOUT_S:g} s") from None

    async def _watch_idle(self) -> None:
        """The host's idle cores every IDLE_PERIOD_S, for the split (a spare core or not)."""
        if self.setup.cpus is not None:
            cpus: Iterable[int] = self.setup.cpus
        else:  # where this process may run, and so its sender processes (not Linux: no /proc/stat, not measured)
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        idle = IdleCores(cpus)
        while True:
            await asyncio.sleep(IDLE_PERIOD_S)
            self.split.idle_cores = idle.sample()

    def use_clock(self, mono_start: float, wall_start: float) -> None:
        """The run clock started: every sender process stamps on it from now on (sent before any assignment)."""
        self._cpu_start = time.process_time()  # the router process's CPU during the run (describe: router_cpu_s)
        for worker in self.workers:  # a sender on another node: its own monotonic clock's reading of the run start
            offset = 0.0 if self.launcher is None else self.launcher.clock_offset(worker.index)
            self._post(worker, ("clock", mono_start + offset, wall_start))
        self.flush()

    def run_ended(self) -> None:
        """The run ended (its t_end): the router process's CPU over it is taken now (once)."""
        if self._cpu_start is not None and self.router_cpu_s is None:
            self.router_cpu_s = time.process_time() - self._cpu_start

    def describe(self) -> dict[str, Any]:
        """run.json `senders`."""
        return {
            "count": self.count,
            "pids": [w.pid for w in self.workers],
            "transport": "multiprocessing pipes (spawned processes) on asyncio transports, multiprocessing's framing "
                         "(a length, then a pickled message list)",
            "clock": "CLOCK_MONOTONIC of this host, shared: stamps are time.monotonic() - the run clock's mono_start",
            "progress_period_s": PROGRESS_PERIOD_S,
            "cpus": None if self.setup.cpus is None else list(self.setup.cpus),  # --pin-cpus
            # the router carries a request itself when its own time so far is under this (0: never)
            "router_sends_under_s": self.sends_under if self.local is not None else 0.0,
            "spare_cores_needed": SPARE_CORES if self.local is not None else None,
            "carried_by_router": self.carried_here,
            # CPU seconds of the router process (all its threads) from the run clock's start to the run's end
            # (t_end): what its core spent on the run (null: the run clock never started)
            "router_cpu_s": self.router_cpu_s,
            "carried_by_process": [w.carried for w in self.workers],
            "fault": None if self.fault is None else str(self.fault),
            **({"placement": "spawned processes on this host"} if self.launcher is None else self.launcher.describe()),
        }

    async def close(self) -> None:
        """Tell every sender process to stop and wait for it (killed after STOP_TIMEOUT_S)."""
        self.run_ended()
        self._closing = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.wait([self._idle_task])
        for worker in self.workers:
            if worker.alive:
                self._post(worker, ("stop",))
        self.flush()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for worker in self.workers:
            while worker.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if worker.process.is_alive():
                worker.process.kill()
            self._forget(worker)
            worker.reported = True
            worker.process.join(1.0)  # exited or killed: at once
            if worker.channel is not None:
                worker.channel.close()
            worker.conn.close()  # closed already once the channel took it over
        if self.launcher is not None:
            self.launcher.close()

    def _forget(self, worker: _Worker) -> None:
        """Stop watching the worker's sentinel (remove_reader of a descriptor not watched does nothing) and sending to
        it."""
        self._loop.remove_reader(worker.process.sentinel)
        self._lost(worker)

    # ---- the Sender contract ----

    def prepare_body(self, request: TraceRequest) -> None:
        if self.local is not None:
            self.local.prepare_body(request)

    def exchange(self, rec: RequestRecord, server: Any, flight: Progress, blocks: tuple[int, ...] | None,
                 now: Callable[[], float]) -> Awaitable[Answer]:
        """Carry `rec` here if the router is on time for it (`sends_under`), else hand it to the sender process with
        the fewest requests in flight and wait for its answer; its stamps are set on `rec` when it comes. (The
        awaitable of either, not a coroutine of its own: one frame less to resume per request.)"""
        if self.fault is not None:
            raise self.fault
        if self.local is not None and not self.split.hand_over(own_so_far(rec, now())):
            self.carried_here += 1
            return self.local.exchange(rec, server, flight, blocks, now)
        return self._hand_over(rec, server, flight, blocks)

    def _take_over(self, rec: RequestRecord, server: Any, flight: Progress, blocks: tuple[int, ...] | None,
                   on_end: Callable[[Answer | None, BaseException | None], None]) -> None:
        """Hand `rec` to the sender process with the fewest requests in flight; `on_end(answer, error)` is called once
        when it ended (flight.Sender.take_over). Its stamps are set on `rec` before."""
        if self.fault is not None:
            raise self.fault
        self._assign(rec, server, flight, blocks, None, on_end)

    def _assign(self, rec: RequestRecord, server: Any, flight: Progress, blocks: tuple[int, ...] | None,
                future: asyncio.Future[Answer | None] | None,
                on_end: Callable[[Answer | None, BaseException | None], None] | None) -> _Pending:
        """Hand `rec` to the sender process with the fewest requests in flight: listed as pending (awaited through
        `future`, or called back through `on_end`) and its "go" queued."""
        alive = self._alive
        if not alive:
            raise SenderDied("no sender process is left")
        worker = alive[0] if len(alive) == 1 else min(alive, key=_in_flight)
        pending = self._pending[rec.id] = _Pending(rec, server, flight, worker, future, on_end)
        worker.in_flight += 1
        worker.carried += 1
        # written with the others of this assignment round (flush(), called by the router when the round is over), or
        # at the end of this loop turn at the latest
        self._post(worker, ("go", rec.id, server.generate_url, rec.input_len, rec.output_len, blocks))
        return pending

    def cancel(self, rid: int) -> None:
        """The router ends request `rid` (taken over): its sender process cancels it and says what it stamped (was it
        sent?); on_end follows with no answer, or with an error that came instead (its sender died meanwhile, a
        broken answer), or with SenderFailed if the sender process says nothing within CANCEL_TIMEOUT_S. Its sender's
        connection closed already: nothing is sent, its death (_report_exit) ends it, or the timeout does (a sender
        on another node whose connection broke may never be seen to exit: the router's close() would wait forever)."""
        pending = self._pending.get(rid)
        if pending is None or pending.cancel_timer is not None:
            return  # ended already, or being cancelled
        worker = pending.worker
        pending.cancel_timer = self._loop.call_later(
            CANCEL_TIMEOUT_S, self._end, pending, None,
            SenderFailed(f"sender process {worker.index} (pid {worker.pid}) did not answer the cancel of request "
                         f"{rid} within {CANCEL_TIMEOUT_S:g} s"))
        if worker.alive:
            self._post(worker, ("cancel", rid))
            self.flush()

    def _end(self, pending: _Pending, answer: Answer | None, err: BaseException | None) -> None:
        """A taken-over request ended: unlisted, then its on_end called (once)."""
        if self._pending.pop(pending.rec.id, None) is None:
            return
        pending.worker.in_flight -= 1
        if pending.cancel_timer is not None:
            pending.cancel_timer.cancel()
        pending.on_end(answer, err)  # type: ignore[misc]

    async def _hand_over(self, rec: RequestRecord, server: Any, flight: Progress,
                         blocks: tuple[int, ...] | None) -> Answer:
        future: asyncio.Future[Answer | None] = self._loop.create_future()
        pending = self._assign(rec, server, flight, blocks, future, None)
        worker = pending.worker
        try:
            answer = await future
            if answer is None:
                raise SenderFailed(f"sender process {worker.index} (pid {worker.pid}) cancelled request {rec.id} "
                                   "that the router had not cancelled")
            return answer
        except asyncio.CancelledError:
            ended = pending.future  # the one awaited, or what _handle put in its place: an answer that came meanwhile
            if not ended.cancelled():  # it ended before the router's cancel took effect
                if ended.exception() is not None:  # its sender died first, or a broken answer: that is how it ended
                    raise ended.exception() from None  # type: ignore[misc]
                raise  # answered: its stamps are on the record; the router records it as it ended it
            if worker.alive:
                # the router ends it: the sender process cancels it and says what it stamped (was it sent?); an
                # error that comes instead (its sender died meanwhile, a broken answer) is raised in its place
                pending.future = future = self._loop.create_future()
                self._post(worker, ("cancel", rec.id))
                self.flush()
                try:
                    await asyncio.wait_for(future, CANCEL_TIMEOUT_S)
                except asyncio.TimeoutError:  # a bug of the sender process: a stop that hangs would be worse
                    raise SenderFailed(f"sender process {worker.index} (pid {worker.pid}) did not answer the cancel "
                                       f"of request {rec.id} within {CANCEL_TIMEOUT_S:g} s") from None
            raise
        finally:
            if self._pending.pop(rec.id, None) is not None:
                pending.worker.in_flight -= 1

    # ---- the connections ----

    def _post(self, worker: _Worker, msg: tuple[Any, ...]) -> None:
        """Queue `msg` for `worker`: written by flush(), or at the end of this loop turn at the latest."""
        if not worker.outbox:
            self._dirty.append(worker)
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self.flush)
        worker.outbox.append(msg)

    def flush(self) -> None:
        """Write what was queued for each sender process, one message list each (the router calls this when an
        assignment round is over: the requests it handed over go at once)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        dirty, self._dirty = self._dirty, []
        for worker in dirty:
            out, worker.outbox = worker.outbox, []
            if worker.alive and worker.channel is not None:
                worker.channel.send(out)  # never blocks; a closed channel is reported by _pipe_closed

    def _received(self, worker: _Worker, msgs: list[tuple[Any, ...]]) -> None:
        handle = self._handle
        for msg in msgs:
            handle(worker, msg)

    def _pipe_closed(self, worker: _Worker, failure: BaseException | None) -> None:
        """The sender process's end of the connection closed: nothing more is sent to it; its exit (the sentinel)
        reports it, with its exit code. A message from it that could not be read or handled is a bug: the run stops
        with it."""
        self._lost(worker)
        if failure is not None:
            self._fault(failure)

    def _lost(self, worker: _Worker) -> None:
        """Nothing more goes to `worker` (its connection closed, or its process ended)."""
        worker.alive = False
        if worker in self._alive:
            self._alive.remove(worker)

    def _handle(self, worker: _Worker, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "progress":
            for rid, t_progress, t_first_token in msg[1]:
                pending = self._pending.get(rid)
                if pending is None:
                    continue
                if t_first_token is not None and pending.rec.t_first_token is None:
                    pending.rec.t_first_token = t_first_token
                if t_progress > pending.flight.t_progress:
                    pending.flight.t_progress = t_progress
                if t_progress > pending.server.t_heard:
                    pending.server.t_heard = t_progress
            return
        if kind == "ready":
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(None)
            return
        pending = self._pending.get(msg[1])
        if pending is None:
            return
        future = pending.future  # None: taken over (on_end)
        if future is not None and future.done():
            if not future.cancelled():
                return  # a request the router gave up on meanwhile (its sender died)
            # the router cancelled it, and this answer came before its cancel went: the answer stands (_hand_over)
            pending.future = future = self._loop.create_future()
        self._apply_stamps(pending, msg[2])
        answer: Answer | None = None  # stays None for "cancelled"
        err: BaseException | None = None
        if kind == "done":
            _, _, _, status, error, meta, connection_lost = msg
            answer = Answer(status, error, meta, connection_lost)
        elif kind == "raised":
            err = self._raised(worker, msg[3], msg[4])
        elif kind != "cancelled":
            raise SenderFailed(f"sender process {worker.index}: unknown message {kind!r}")
        if future is None:
            self._end(pending, answer, err)
        elif err is not None:
            future.set_exception(err)
        else:
            future.set_result(answer)

    @staticmethod
    def _apply_stamps(pending: _Pending, stamps: tuple[Any, ...]) -> None:
        """The stamps a sender process took, onto the record; its end is its server's and its flight's progress."""
        rec = pending.rec
        for name, value in zip(STAMP_FIELDS, stamps):
            setattr(rec, name, value)
        if rec.t_finish is not None:
            if rec.t_finish > pending.flight.t_progress:
                pending.flight.t_progress = rec.t_finish
            if rec.t_finish > pending.server.t_heard:
                pending.server.t_heard = rec.t_finish

    @staticmethod
    def _raised(worker: _Worker, name: str, text: str) -> BaseException:
        """A sender process's "raised": a broken contract (ServerProtocolError) or its bug (SenderFailed)."""
        if name == "ServerProtocolError":
            return ServerProtocolError(text)
        return SenderFailed(f"sender process {worker.index} (pid {worker.pid}): {name}: {text}")

    def _died(self, worker: _Worker) -> None:
        """The sender process exited (its sentinel is readable): a fault the run reports."""
        if worker.reported:
            return
        worker.reported = True
        self._forget(worker)
        self._report_exit(worker, 0)

    def _report_exit(self, worker: _Worker, tries: int) -> None:
        if self._closing:
            return
        worker.process.join(0)  # it has exited: this only collects its exit code...
        code = worker.process.exitcode
        if code is None and tries < 100:  # ...once the kernel has it (its pipes close a moment before)
            self._loop.call_later(0.01, self._report_exit, worker, tries + 1)
            return
        how = worker.process.exit_text or "exit code unknown"
        err = SenderDied(f"sender process {worker.index} (pid {worker.pid}) died ({how}); its requests in flight "
                         "are recorded as errors and the run stops (docs/replay.md, \"Parallel senders\")")
        if worker.ready is not None and not worker.ready.done():
            worker.ready.set_exception(err)
        for pending in list(self._pending.values()):
            if pending.worker is not worker:
                continue
            if pending.on_end is not None:
                self._end(pending, None, err)
            elif not pending.future.done():  # type: ignore[union-attr]
                pending.future.set_exception(err)  # type: ignore[union-attr]
        self._fault(err)

    def _fault(self, err: BaseException) -> None:
        if self.fault is None:
            self.fault = err
        if self.on_fault is not None:
            self.on_fault(err)
