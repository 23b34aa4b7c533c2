"""GPU utilisation, memory and power beside the load: one `nvidia-smi --query-gpu=... -lms 1000` process for the
whole run, its CSV lines read as they come and written to gpu.jsonl (docs/run-format.md), each GPU mapped to the
server tracebench launched on it (its CUDA_VISIBLE_DEVICES).

The command is `nvidia-smi` on PATH, or the executable named by TRACEBENCH_NVIDIA_SMI (a machine where it lives
elsewhere; the tests' fake one that prints CSV lines). Sampled only when a server runs on this host and is not a
simulator, or when TRACEBENCH_NVIDIA_SMI is set (asked for explicitly); otherwise run.json `gpu_telemetry` says
why not. Reading one line per GPU per second is all the event loop does for it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import orjson

from tracebench.paths import portable_words, shareable_text
from tracebench.replay.clock import RunClock
from tracebench.replay.records import AppendFile, OnFailure
from tracebench.replay.servers import _pdeathsig_preexec as pdeathsig_preexec

ENV_COMMAND = "TRACEBENCH_NVIDIA_SMI"
PERIOD_MS = 1000
# nvidia-smi --help-query-gpu names; "[N/A]" / "[Not Supported]" read as null. The name last: it is the one field
# that could hold the ", " separator.
QUERY = ("index", "uuid", "utilization.gpu", "utilization.memory", "memory.used", "memory.total", "power.draw",
         "name")
# gpu.jsonl's value fields, in QUERY's order after index and uuid
VALUE_FIELDS = ("util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib", "power_w")
STDERR_KEEP = 2000


def find_command(servers_here: bool, simulated_only: bool) -> tuple[list[str] | None, str | None]:
    """(the nvidia-smi command, None) or (None, why there is none). `servers_here`: a server runs on this host;
    `simulated_only`: every server is a tracebench simulator (which uses no GPU)."""
    explicit = os.environ.get(ENV_COMMAND)
    if explicit:
        return [explicit], None  # given on purpose: used, and a wrong path fails when it starts (said in run.json)
    if not servers_here:
        return None, "no server runs on this host"
    if simulated_only:
        return None, "the servers are simulated (they use no GPU)"
    found = shutil.which("nvidia-smi")
    if found is None:
        return None, "no nvidia-smi on PATH"
    return [found], None


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]: this GPU does not report it


def _terminate(proc: asyncio.subprocess.Process) -> None:
    try:
        proc.terminate()
    except ProcessLookupError:
        pass  # it ended on its own a moment ago: what terminate was for


class GpuSampler:
    """The nvidia-smi process of one run and the reader of its lines. `server_of`: a CUDA_VISIBLE_DEVICES entry
    (index or UUID) -> the index of the server tracebench launched there."""

    def __init__(self, command: list[str], path: Path, server_of: dict[str, int]) -> None:
        self.command = [*command, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits",
                        "-lms", str(PERIOD_MS)]
        self.path = path
        self.server_of = server_of
        self.proc: asyncio.subprocess.Process | None = None
        self.gpus: dict[int, dict[str, Any]] = {}  # index -> {index, uuid, name, server}
        self.rows = 0
        self.error: str | None = None
        self.stopping = False
        self.stderr = b""

    async def start(self) -> None:
        """Start the process (before the run clock: spawning it is no work of the loop during the run)."""
        self.path.touch()  # run.json names the file from now on, rows or not
        try:
            # its own session: a Ctrl-C at the terminal reaches tracebench, which stops it after the requests
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=pdeathsig_preexec(),
            )
        except OSError as err:
            self.error = f"{self.command[0]} did not start: {err.strerror or err}"

    async def read(self, clock: RunClock, on_failure: OnFailure) -> None:
        """Write a row per line until the process ends (stopped, or its own failure: then `error` says so). Rows go
        to gpu.jsonl in whole lines (records.AppendFile): a write that fails (disk full) is cut back to the last whole
        line, nothing more is written (the lines are still read), and `on_failure` stops the run."""
        if self.proc is None:
            return
        await asyncio.gather(self._lines(clock, on_failure), self._drain_stderr())
        code = await self.proc.wait()
        if self.error is None and not self.stopping:
            why = self.stderr.decode("utf-8", "replace").strip()[-STDERR_KEEP:]
            self.error = f"nvidia-smi exited by itself (code {code}) during the run{': ' + why if why else ''}"

    async def _lines(self, clock: RunClock, on_failure: OnFailure) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with AppendFile(self.path, on_failure, flush_lines=1) as out:
            while line := await self.proc.stdout.readline():
                row = self._row(clock.now(), line)
                if row is None:
                    self.error = f"nvidia-smi printed a line that is not the queried CSV: {line[:300]!r}"
                    _terminate(self.proc)
                    return
                out.write(orjson.dumps(row) + b"\n")
                self.rows = out.lines_on_disk  # rows that reached the file

    async def _drain_stderr(self) -> None:
        # read as it comes, so a talkative nvidia-smi never blocks on a full pipe; the last part is kept for the error
        assert self.proc is not None and self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(4096):
            self.stderr = (self.stderr + chunk)[-STDERR_KEEP:]

    def _row(self, t: float, line: bytes) -> dict[str, Any] | None:
        cells = line.decode("utf-8", "replace").rstrip("\r\n").split(", ", len(QUERY) - 1)
        if len(cells) != len(QUERY):
            return None
        try:
            index = int(cells[0])
        except ValueError:
            return None
        if index not in self.gpus:
            uuid, name = cells[1].strip(), cells[-1].strip()
            server = self.server_of.get(str(index), self.server_of.get(uuid))
            self.gpus[index] = {"index": index, "uuid": uuid, "name": name, "server": server}
        row: dict[str, Any] = {"t": t, "gpu": index, "server": self.gpus[index]["server"]}
        row.update(zip(VALUE_FIELDS, map(_number, cells[2:-1])))
        return row

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 5 s) once the run ended."""
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        _terminate(proc)
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()

    def describe(self) -> dict[str, Any]:
        # a run folder names no path of the machine (docs/run-format.md, "Paths"): nvidia-smi as `…/nvidia-smi`
        return {"command": portable_words(self.command), "file": self.path.name, "period_s": PERIOD_MS / 1000,
                "rows": self.rows, "gpus": [self.gpus[i] for i in sorted(self.gpus)],
                "error": None if self.error is None else shareable_text(self.error, everywhere=True)}
