"""Read run folders (docs/run-format.md): `run.json` validated field by field, `requests.jsonl` scanned with polars.

A folder is read the same way in either of its forms: as `tracebench replay` wrote it (run.json, requests.jsonl,
telemetry.jsonl) or packed by `tracebench pack` (run.json.xz, requests.parquet, telemetry.parquet: the same records,
the same columns). Every reader of run folders goes through `run_file`, so none needs to know which form it has.

Nothing of the replay path is imported: the report reads the files. polars does the parsing; its errors do not name
lines, so when it refuses a JSONL file (or a record breaks a rule) the file is walked again with orjson to name the
line. In a packed file the place of a broken record is its row (1-based), in the same `file:N` form.

A big run's requests.jsonl has beside it, from the replay's clean end, its columnar copy `requests.columns.parquet`
(tracebench/report/columns.py writes it; docs/run-format.md): the same records, read ~10x faster than the JSON is
parsed. It is read instead of the JSONL only when it is a copy of the JSONL as it is now (size and mtime as recorded
in the copy, or else the same sha256), and every record is then checked by the same rules, a broken one named by its
JSONL line. A copy that is not one of this JSONL (the JSONL changed after the run, or the copy is damaged) stops the
read, naming the copy: the report never guesses which of the two is right.

A run replayed at `--speed K` (run.json `speed`) is K times compressed. Once validated, its times are converted here,
once, to simulated seconds (run.json's t_end, cap change and event times ×K; the records by report/speed.py, which
keeps the host's real overheads out of the ×K), so every metric and plot of the report is in simulated seconds and
compares with a run on real GPUs.
"""

from __future__ import annotations

import hashlib
import lzma
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from tracebench.errors import ConfigError, RunFolderError
from tracebench.itl import HIST_PATTERN
# requests.jsonl's columnar copy (its name), written beside it at the clean end of a big replay
from tracebench.report.copy_name import COLUMNS_COPY
from tracebench.replay.summary import MODELLED_HOPS
from tracebench.report.speed import to_simulated_times

RUN_FORMAT_VERSION = 1
RUN_STATUSES = ("running", "completed", "interrupted", "failed", "not_started", "saturated")
REQUEST_STATUSES = ("ok", "mismatch", "error", "timeout", "cancelled", "not_sent")
# answers that finished (replay/records.py COMPLETED): `ok`, and `mismatch` (the server generated or counted something
# else than the trace asked: the record's `mismatch` says what); latencies and throughputs are over these
COMPLETED_STATUSES = ("ok", "mismatch")


def is_completed() -> pl.Expr:
    """True on a completed record (status in COMPLETED_STATUSES): two comparisons, which read the short status
    strings in place (a tenth of the time of `is_in`, which hashes every one; evaluated on every record several
    times a report)."""
    status = pl.col("status")
    return pl.any_horizontal([status == name for name in COMPLETED_STATUSES])

# PD runs' prefill side (records.py); null in a plain run
PD_FLOAT_FIELDS = ("t_prefill_answer", "prefill_received", "prefill_forward_entry", "prefill_done", "prefill_finished",
                   "prefill_queue_time", "prefill_e2e_latency")
PD_COLUMNS = ("prefill_server", "bootstrap_room", *PD_FLOAT_FIELDS)
# the breakdown's stamps (records.py, docs/overhead.md): where a request's time went, step by step
BREAKDOWN_FIELDS = ("t_assigned", "t_built", "t_written", "t_headers", "t_last_chunk", "t_parsed", "server_dispatched",
                    "server_first_sent")
# the columns of requests.jsonl, in the order replay writes them (tracebench/replay/records.py RequestRecord)
REQUEST_COLUMNS = (
    "id", "input_len", "output_len", "t_arrival", "t_released", "t_dispatch", "t_first_token", "t_finish", "server",
    "batch", "status", "error", "completion_tokens", "prompt_tokens", "cached_tokens", "server_e2e_latency", "server_queue_time",
    "server_received", "server_forward_entry", "server_prefill_finished", "server_finished", "itl_max", "itl_hist",
    "mismatch", "t_admitted", "policy_s", "sim_lag", *BREAKDOWN_FIELDS, "slot_wait_s", "batch_wait_s",
    *PD_COLUMNS,
)
INT_FIELDS = ("id", "input_len", "output_len", "server", "batch", "completion_tokens", "prompt_tokens", "cached_tokens",
              "prefill_server", "bootstrap_room")
# columns the run format gained after its first runs: a run recorded before has none (read as null: not recorded)
LATER_COLUMNS = frozenset({"cached_tokens", "itl_max", "itl_hist", "mismatch", "t_admitted", "policy_s", "sim_lag",
                           *BREAKDOWN_FIELDS, "slot_wait_s", "batch_wait_s", *PD_COLUMNS})
FLOAT_FIELDS = (
    "t_arrival", "t_released", "t_dispatch", "t_first_token", "t_finish",
    "server_e2e_latency", "server_queue_time", "server_received", "server_forward_entry",
    "server_prefill_finished", "server_finished", "itl_max", "t_admitted", "policy_s", "sim_lag", *BREAKDOWN_FIELDS,
    "slot_wait_s", "batch_wait_s", *PD_FLOAT_FIELDS,
)
# itl_hist: inter-token gaps, "bucket:count,..." (tracebench/itl.py); mismatch: what differs from the trace, and why
STR_FIELDS = ("status", "error", "itl_hist", "mismatch")
TIME_FIELDS = FLOAT_FIELDS  # every float field is a time (a run-clock stamp or a duration, seconds)
# never null, whatever the status
REQUIRED_FIELDS = ("id", "input_len", "output_len", "t_arrival", "status")
# never null in a completed (`ok` or `mismatch`) record: an answer that completed went through every step
OK_REQUIRED_FIELDS = ("t_released", "t_dispatch", "t_finish", "server", "completion_tokens")
# the run-format invariant for completed records: each stamp is >= the one before it (t_first_token may be null, and
# t_admitted and the breakdown's stamps in runs recorded before them)
OK_ORDER = ("t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written", "t_headers",
            "t_first_token", "t_last_chunk", "t_finish", "t_parsed")

# slack for slot_wait_s <= t_assigned - t_admitted: differences of different run-clock readings (a static batch sent
# back adds its first wait to the second), and for batch_wait_s <= t_built - t_assigned, for symmetry
SLOT_WAIT_ULP = 1e-9

ROW = "_row"  # 0-based index of the record among the file's records

# polars parses a JSONL file in pieces, each piece a chunk of the frame. Its default piece, ~0.5 MB, leaves ~2,500
# chunks per 1M records, on which every later filter, sort and rule runs 2-3x slower until they are made one (a copy
# of the whole frame, ~0.4 CPU-s); pieces of 16 MiB leave ~80 chunks, as fast to work on as one, and the parse itself
# costs less (fewer, larger buffers: ~half its page faults). The piece is polars' environment variable, read at each
# scan: the report command sets it for its process (read_jsonl_in_large_pieces).
NDJSON_READ_SIZE_VARIABLE = "POLARS_FORCE_NDJSON_READ_SIZE"
NDJSON_READ_BYTES = 16 << 20


def read_jsonl_in_large_pieces() -> None:
    """Have polars parse JSONL files in pieces of NDJSON_READ_BYTES from now on, in this process (a value the user
    set is left as it is). Only the speed changes: the same frame, in fewer chunks."""
    os.environ.setdefault(NDJSON_READ_SIZE_VARIABLE, str(NDJSON_READ_BYTES))


# a plain file of the run folder -> its packed form (`tracebench pack`)
PACKED_NAMES = {"run.json": "run.json.xz", "requests.jsonl": "requests.parquet", "telemetry.jsonl": "telemetry.parquet",
                "server_metrics.jsonl": "server_metrics.parquet", "gpu.jsonl": "gpu.parquet"}
# the Parquet key-value metadata of the copy: what it was made from (COPY_SOURCE_FIELDS), as JSON
COPY_METADATA_KEY = "tracebench_requests_copy"
COPY_VERSION = 1
COPY_SOURCE_FIELDS = {"version": int, "source": str, "size": int, "mtime_ns": int, "sha256": str, "rows": int}
# the whole /metrics text of each server at the start and end of the run (packed: .xz)
METRICS_TEXT_PATTERN = "metrics-*-*.txt"

# server_metrics.jsonl's sglang families (tracebench/replay/server_metrics.py FIELDS; tests/test_telemetry.py checks
# that both lists agree): gauges, counters, histograms' _sum and _count, each folded over its label sets
SERVER_METRIC_FIELDS = (
    "num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "gen_throughput", "cache_hit_rate",
    "num_requests_total", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
    "num_aborted_requests_total",
    *(f"{h}_{part}" for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
                              "inter_token_latency_seconds") for part in ("sum", "count")),
)
# the files beside the load and the run.json key that says whether the run wrote one
BESIDE_FILES = {"server_metrics.jsonl": "server_metrics", "gpu.jsonl": "gpu_telemetry"}


def request_schema() -> dict[str, Any]:
    types = {**dict.fromkeys(INT_FIELDS, pl.Int64), **dict.fromkeys(FLOAT_FIELDS, pl.Float64),
             **dict.fromkeys(STR_FIELDS, pl.String)}
    return {name: types[name] for name in REQUEST_COLUMNS}


def telemetry_schema() -> dict[str, Any]:
    """telemetry.jsonl's fields (tracebench/replay/telemetry.py); `error` appears only on a failed poll."""
    return {"t": pl.Float64, "server": pl.Int64, "healthy": pl.Boolean, "in_flight": pl.Int64, "cap": pl.Int64,
            "router_queue": pl.Int64, "num_running_reqs": pl.Int64, "num_waiting_reqs": pl.Int64,
            "token_usage": pl.Float64, "gen_throughput": pl.Float64, "error": pl.String}


def server_metrics_schema() -> dict[str, Any]:
    """server_metrics.jsonl (tracebench/replay/server_metrics.py): one row per scrape per server; a failed scrape has
    only t, server, scrape_s and `error`."""
    return {"t": pl.Float64, "server": pl.Int64, "scrape_s": pl.Float64,
            **dict.fromkeys(SERVER_METRIC_FIELDS, pl.Float64), "error": pl.String}


def gpu_schema() -> dict[str, Any]:
    """gpu.jsonl (tracebench/replay/gpu.py): one row per GPU per nvidia-smi sample; a value the GPU does not report
    is null."""
    return {"t": pl.Float64, "gpu": pl.Int64, "server": pl.Int64, "util_pct": pl.Float64, "mem_util_pct": pl.Float64,
            "mem_used_mib": pl.Float64, "mem_total_mib": pl.Float64, "power_w": pl.Float64}


BESIDE_SCHEMAS = {"server_metrics.jsonl": server_metrics_schema, "gpu.jsonl": gpu_schema}


def run_file(folder: Path, name: str) -> Path:
    """Where `folder` keeps `name` (run.json, requests.jsonl or telemetry.jsonl): the file itself, or its packed form.
    The path returned may not exist (the caller says what its absence means)."""
    plain, packed = folder / name, folder / PACKED_NAMES[name]
    if plain.exists() and packed.exists():
        raise RunFolderError(folder, None, None,
                             f"has both {name} and {packed.name} (a `tracebench pack` was interrupted): {name} is the "
                             f"original; delete {packed.name} and pack again")
    if name == "requests.jsonl" and packed.exists() and (folder / COLUMNS_COPY).exists():
        # pack removes the copy before the JSONL: this copy is of a requests.jsonl that is no longer here
        raise RunFolderError(folder / COLUMNS_COPY, None, None,
                             f"a copy of requests.jsonl, beside {packed.name} without it: delete {COLUMNS_COPY}")
    return packed if packed.exists() else plain


def is_run_folder(folder: Path) -> bool:
    return (folder / "run.json").is_file() or (folder / PACKED_NAMES["run.json"]).is_file()


def is_packed(folder: Path) -> bool:
    """True when any file of `folder` is in its packed form (a run is packed whole: see tracebench.report.pack)."""
    return any((folder / packed).exists() for packed in PACKED_NAMES.values()) or any(
        folder.glob("server-*.log.xz")) or (folder / "router.log.xz").exists() or any(
        folder.glob(METRICS_TEXT_PATTERN + ".xz"))


@dataclass
class Run:
    """One run folder, read and validated. `requests` holds every record (all fields of the schema + `_row`)."""

    label: str  # how the report names the run (run_name; the folder path when two runs share a name)
    path: Path
    meta: dict[str, Any]  # run.json, its run-clock times (t_end, caps.changes[].t, events[].t) in simulated seconds
    requests: pl.DataFrame  # time fields in simulated seconds (run seconds × speed)

    @property
    def speed(self) -> float | None:
        """--speed K of the replay (its times were multiplied by K on loading); None: not sped up."""
        return self.meta["speed"]

    @property
    def status(self) -> str:
        return self.meta["status"]

    @property
    def trace_sha256(self) -> str:
        return self.meta["trace"]["sha256"]

    @property
    def trace_path(self) -> str:
        return self.meta["trace"]["path"]

    @property
    def num_servers(self) -> int:
        return len(self.meta["servers"])

    @property
    def via_router(self) -> bool:
        """The run went through sglang-router (run.json external_router): records have no server."""
        return via_router(self.meta)

    @property
    def missing(self) -> int:
        """Requests of the trace that have no record (only possible in a run that did not complete)."""
        return self.meta["trace"]["num_requests"] - self.requests.height


def resolve_run_dir(spec: str, reports_dir: Path) -> Path:
    """A RUN argument: a run folder path, or the name of a folder in `reports_dir`."""
    direct = Path(spec)
    if direct.is_dir():
        return direct
    named = reports_dir / spec
    if named.is_dir():
        return named
    if direct.exists():
        raise RunFolderError(spec, None, None, "not a run folder (it is a file)")
    raise RunFolderError(spec, None, None, f"no such run folder (looked at ./{spec} and {named})")


def load_runs(specs: list[str], reports_dir: Path) -> list[Run]:
    dirs = [resolve_run_dir(spec, reports_dir) for spec in specs]
    seen: dict[Path, str] = {}
    for spec, folder in zip(specs, dirs):
        real = folder.resolve()
        if real in seen:
            raise ConfigError(f"run '{spec}' is given twice (also as '{seen[real]}'): compare different runs")
        seen[real] = spec
    from tracebench.report.threads import per_run

    runs = per_run(load_run, dirs)
    names = [run.meta["run_name"] for run in runs]
    for run in runs:
        if names.count(run.meta["run_name"]) > 1:
            run.label = str(run.path)
    return runs


def load_run(folder: Path) -> Run:
    meta = read_run_json(folder)
    requests = read_requests(run_file(folder, "requests.jsonl"), meta)
    if meta["speed"] is not None:
        meta, requests = to_simulated_seconds(meta, requests, float(meta["speed"]))
    return Run(label=meta["run_name"], path=folder, meta=meta, requests=requests)


def to_simulated_seconds(
    meta: dict[str, Any], requests: pl.DataFrame, speed: float
) -> tuple[dict[str, Any], pl.DataFrame]:
    """A run at --speed K, K times compressed on its run clock: the run's timeline ×K (so throughputs are ÷K); each
    request's stamps with simulator time ×K and host time as measured (report/speed.py)."""
    requests, how = to_simulated_times(requests, meta, speed)
    caps = meta["caps"]
    meta = {
        **meta,
        "speed_conversion": how,
        "t_end": None if meta["t_end"] is None else meta["t_end"] * speed,
        "caps": {**caps, "changes": [{**change, "t": change["t"] * speed} for change in caps["changes"]]},
        "events": [{**event, "t": event["t"] * speed} for event in meta["events"]],
    }
    return meta, requests


# ---------------------------------------------------------------------------------------------------- run.json

def _need(obj: dict[str, Any], key: str, kinds: tuple[type, ...], path: Path, field: str, nullable: bool = False) -> Any:
    if key not in obj:
        raise RunFolderError(path, None, field, "missing")
    value = obj[key]
    if value is None and nullable:
        return value
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        names = " or ".join(k.__name__ for k in kinds) + (" or null" if nullable else "")
        raise RunFolderError(path, None, field, f"must be {names}, got {value!r}")
    return value


def read_run_json(folder: Path) -> dict[str, Any]:
    path = run_file(folder, "run.json")
    if not path.is_file():
        raise RunFolderError(folder, None, None, "not a run folder: it has no run.json (nor run.json.xz)")
    data = path.read_bytes()
    if path.suffix == ".xz":
        try:
            data = lzma.decompress(data, format=lzma.FORMAT_XZ)
        except (lzma.LZMAError, EOFError) as err:
            raise RunFolderError(path, None, None, f"not a whole xz file ({err})") from None
    try:
        meta = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise RunFolderError(path, None, None, f"not JSON ({err})") from None
    if not isinstance(meta, dict):
        raise RunFolderError(path, None, None, f"expected a JSON object, got {type(meta).__name__}")
    if "tracebench_run" not in meta:
        raise RunFolderError(path, None, "tracebench_run", "missing (is this a tracebench run folder?)")
    if meta["tracebench_run"] != RUN_FORMAT_VERSION:
        raise RunFolderError(path, None, "tracebench_run",
                             f"unknown run format version {meta['tracebench_run']!r} (this tracebench reads {RUN_FORMAT_VERSION})")
    _need(meta, "run_name", (str,), path, "run_name")
    trace = _need(meta, "trace", (dict,), path, "trace")
    _need(trace, "path", (str,), path, "trace.path")
    _need(trace, "sha256", (str,), path, "trace.sha256")
    num = _need(trace, "num_requests", (int,), path, "trace.num_requests")
    if num < 0:
        raise RunFolderError(path, None, "trace.num_requests", f"must be >= 0, got {num}")
    _need(meta, "options", (dict,), path, "options")
    if "speed" not in meta:
        raise RunFolderError(path, None, "speed", "missing (written by a tracebench whose --speed did not compress the "
                                                  "arrivals: replay the trace again)")
    speed = _need(meta, "speed", (int, float), path, "speed", nullable=True)
    if speed is not None and not (math.isfinite(speed) and speed > 0):
        raise RunFolderError(path, None, "speed", f"must be a number > 0 or null, got {speed!r}")
    _need(meta, "backend", (str,), path, "backend")
    _need(meta, "mode", (str,), path, "mode")
    _need(meta, "batch_size", (int,), path, "batch_size", nullable=True)
    policy = _need(meta, "policy", (dict,), path, "policy")
    _need(policy, "name", (str,), path, "policy.name")
    _need(policy, "options", (dict,), path, "policy.options")
    servers = _need(meta, "servers", (list,), path, "servers")
    if not servers:
        raise RunFolderError(path, None, "servers", "empty: a run has at least one server")
    for i, server in enumerate(servers):
        if not isinstance(server, dict):
            raise RunFolderError(path, None, f"servers[{i}]", f"must be an object, got {server!r}")
        _need(server, "url", (str,), path, f"servers[{i}].url")
        _need(server, "gpu", (str, int), path, f"servers[{i}].gpu", nullable=True)
        _need(server, "version", (str,), path, f"servers[{i}].version", nullable=True)
        sim = (server.get("server_info") or {}).get("tracebench_sim")
        for key in MODELLED_HOPS:  # the --speed conversion reads them (report/speed.py)
            if isinstance(sim, dict) and key in sim:
                hop = sim[key]
                if type(hop) not in (int, float) or not (math.isfinite(hop) and hop >= 0):
                    raise RunFolderError(path, None, f"servers[{i}].server_info.tracebench_sim.{key}",
                                         f"must be a number >= 0, got {hop!r}")
    if meta.get("external_router") is not None:  # --router sglang-router
        external = _need(meta, "external_router", (dict,), path, "external_router")
        counters = _need(external, "server_counters", (list,), path, "external_router.server_counters", nullable=True)
        for i, row in enumerate(counters or []):
            where = f"external_router.server_counters[{i}]"
            if not isinstance(row, dict):
                raise RunFolderError(path, None, where, f"must be an object, got {row!r}")
            _need(row, "requests", (int,), path, f"{where}.requests", nullable=True)
    _need(meta, "gpu_names", (list,), path, "gpu_names")
    caps = _need(meta, "caps", (dict,), path, "caps")
    _need(caps, "initial", (list,), path, "caps.initial")
    changes = _need(caps, "changes", (list,), path, "caps.changes")
    for i, change in enumerate(changes):
        if not isinstance(change, dict):
            raise RunFolderError(path, None, f"caps.changes[{i}]", f"must be an object, got {change!r}")
        _need(change, "t", (int, float), path, f"caps.changes[{i}].t")
        _need(change, "cap", (int,), path, f"caps.changes[{i}].cap")
    events = _need(meta, "events", (list,), path, "events")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise RunFolderError(path, None, f"events[{i}]", f"must be an object, got {event!r}")
        _need(event, "t", (int, float), path, f"events[{i}].t")
    status = _need(meta, "status", (str,), path, "status")
    if status not in RUN_STATUSES:
        raise RunFolderError(path, None, "status", f"must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
    if status == "not_started":  # no requests.jsonl: nothing to report, and the user must hear why
        raise RunFolderError(path, None, "status", f"not_started: this run never started, no request was sent "
                             f"({str(meta.get('error')).splitlines()[0]})")
    _need(meta, "t_end", (int, float), path, "t_end", nullable=(status == "running"))
    return meta


def via_router(meta: dict[str, Any]) -> bool:
    """The run went through sglang-router (run.json external_router)."""
    return meta.get("external_router") is not None


# ---------------------------------------------------------------------------------------------- requests.jsonl

_ID_AGAIN = "this id was already recorded on an earlier line (each request appears once)"


def _ids_distinct(ids: pl.Series) -> bool:
    """True when the ids are shown distinct by counting them (trace ids are 0..N-1: a bincount, 10x the speed of
    hashing a million ids); False when that cannot tell (nulls, ids out of that range), and the rule decides."""
    if ids.null_count() or ids.len() == 0:
        return False
    low, high = ids.min(), ids.max()
    if low < 0 or high >= 4 * ids.len() + 1024:  # keep the count array small
        return False
    return int(np.bincount(ids.to_numpy()).max()) <= 1


def _record_rules(num_servers: int, through_router: bool, stamps: frozenset[str]) -> list[tuple[str, pl.Expr, str]]:
    """(field, expression true on a broken record, why). Evaluated vectorised over the whole file. `stamps`: the
    OK_ORDER stamps not null in every record (a stamp null throughout breaks no order rule and is skipped by the
    coalesce anyway: leaving it out saves a pass per stamp on runs recorded before it)."""
    c = pl.col
    ok = is_completed()
    if through_router:  # sglang-router chose the server and does not say which
        server_rules = [("server", c("server").is_not_null(), "not null although the run went through sglang-router")]
    else:
        server_rules = [
            ("server", (c("server") < 0) | (c("server") >= num_servers),
             f"not an index into run.json servers (the run has {num_servers})"),
            ("server", c("t_dispatch").is_not_null() & c("server").is_null(), "null although the request was dispatched"),
        ]
    rules: list[tuple[str, pl.Expr, str]] = [(name, c(name).is_null(), "missing or null") for name in REQUIRED_FIELDS]
    rules += [
        ("status", ~c("status").is_in(list(REQUEST_STATUSES)), f"must be one of {', '.join(REQUEST_STATUSES)}"),
        ("id", ~c("id").is_first_distinct(), _ID_AGAIN),
        ("input_len", c("input_len") < 1, "must be >= 1"),
        ("output_len", c("output_len") < 1, "must be >= 1"),
        ("t_arrival", c("t_arrival") < 0, "must be >= 0"),
        *server_rules,
        ("completion_tokens", c("completion_tokens") < 0, "must be >= 0"),
        ("itl_hist", ~c("itl_hist").str.contains(HIST_PATTERN), "must be 'bucket:count,...' (tracebench/itl.py)"),
        ("t_finish", c("t_finish") < c("t_dispatch"), "before t_dispatch"),
        ("t_finish", c("t_dispatch").is_not_null() & c("t_finish").is_null(),
         "null although the request was dispatched (a failure also sets it)"),
        # a part of t_admitted -> t_assigned (records.py; the clock's float sums may differ by an ulp or so)
        ("slot_wait_s", (c("slot_wait_s") < 0) | (c("slot_wait_s") > c("t_assigned") - c("t_admitted") + SLOT_WAIT_ULP),
         "outside 0..t_assigned - t_admitted (it is the part of that span with no free slot)"),
        # a part of t_assigned -> t_built: the batch was sent after its member was assigned, before its body was made
        ("batch_wait_s", (c("batch_wait_s") < 0) | (c("batch_wait_s") > c("t_built") - c("t_assigned") + SLOT_WAIT_ULP),
         "outside 0..t_built - t_assigned (it is the part of that span until the request's static batch was sent)"),
    ]
    rules += [(name, ok & c(name).is_null(), "null in a completed (ok or mismatch) record") for name in OK_REQUIRED_FIELDS
              if not (through_router and name == "server")]
    rules += [
        ("mismatch", (c("status") == "mismatch") & c("mismatch").is_null(), "null in a mismatch record (it says what differs)"),
        ("mismatch", (c("status") != "mismatch") & c("mismatch").is_not_null(), "set in a record whose status is not mismatch"),
    ]
    # stamps compared in order, skipping a null one (t_admitted in older runs, t_first_token without streaming)
    for i, later in enumerate(OK_ORDER[1:], start=1):
        before = [c(name) for name in reversed(OK_ORDER[:i]) if name in stamps]
        if later not in stamps or not before:
            continue
        earlier = pl.coalesce(before)
        rules.append((later, ok & (c(later) < earlier),
                      f"before {OK_ORDER[i - 1]} (or an earlier stamp) in a completed record (run-format invariant)"))
    return rules


def read_requests(path: Path, meta: dict[str, Any]) -> pl.DataFrame:
    """requests.jsonl or requests.parquet (run_file), every record checked against the run format's rules."""
    if not path.is_file():
        raise RunFolderError(path, None, None, "missing: the run recorded no request")
    if path.suffix == ".parquet":
        frame = read_parquet_table(path, request_schema()).with_row_index(ROW)
    elif (path.parent / COLUMNS_COPY).exists():
        frame = read_columns_copy(path, path.parent / COLUMNS_COPY).with_row_index(ROW)
    else:
        frame = read_jsonl_table(path, request_schema(), row_index=True)
    if frame.height == 0:
        raise RunFolderError(path, None, None, "empty run: no request was recorded")
    stamps = frozenset(name for name in OK_ORDER if frame[name].null_count() < frame.height)
    rules = _record_rules(len(meta["servers"]), via_router(meta), stamps)
    # first whether any rule breaks at all (one lazy pass, an `any` per rule: a third of the time of locating the first
    # broken row of every rule), and only then where
    checked = [expr for _, expr, why in rules if not (why == _ID_AGAIN and _ids_distinct(frame["id"]))]
    if any(frame.lazy().select([expr.fill_null(False).any().alias(str(i)) for i, expr in enumerate(checked)])
           .collect().row(0)):
        _raise_first_broken(path, frame, rules)
    num_requests = meta["trace"]["num_requests"]
    if path.suffix == ".jsonl" and (frame.height > num_requests
                                    or (meta["status"] == "completed" and frame.height != num_requests)):
        _raise_located(path, row=None)  # polars skips empty lines: name one if that is why the count is off
    if frame.height > num_requests:
        raise RunFolderError(path, None, None,
                             f"has {frame.height} records, the trace has only {num_requests} requests (run.json trace.num_requests)")
    if meta["status"] == "completed" and frame.height != num_requests:
        raise RunFolderError(path, None, None,
                             f"has {frame.height} records but the trace has {num_requests} requests and run.json says the run completed")
    if meta.get("pd"):
        # a PD decode server's prefill_finished_time is one stale value, not the request's (.DUCUMENT/
        # pd-disaggregation.md section 3): PD runs recorded before the replay dropped it read it as null
        frame = frame.with_columns(pl.lit(None, pl.Float64).alias("server_prefill_finished"))
    return frame


def file_sha256_and_lines(path: Path) -> tuple[str, int]:
    """sha256 of a file, hex, and how many newlines it has, in one read of 8 MiB pieces (hashlib releases the GIL on
    each piece: two runs are hashed at once)."""
    digest, lines = hashlib.sha256(), 0
    buffer = bytearray(8 << 20)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as fh:
        while size := fh.readinto(buffer):
            digest.update(view[:size])
            lines += buffer.count(b"\n", 0, size)
    return digest.hexdigest(), lines


def copy_source(copy: Path) -> dict[str, Any]:
    """What the columnar copy `copy` says it was made from (COPY_SOURCE_FIELDS), checked field by field."""
    try:
        metadata = pl.read_parquet_metadata(copy)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise RunFolderError(copy, None, None, f"not a readable Parquet file ({err}): a damaged copy of "
                             f"requests.jsonl; delete it (the report then parses requests.jsonl)") from None
    if COPY_METADATA_KEY not in metadata:
        raise RunFolderError(copy, None, COPY_METADATA_KEY, "missing from its Parquet metadata: not a copy tracebench "
                             "made of requests.jsonl; delete it (the report then parses requests.jsonl)")
    try:
        source = orjson.loads(metadata[COPY_METADATA_KEY])
    except orjson.JSONDecodeError as err:
        raise RunFolderError(copy, None, COPY_METADATA_KEY, f"not JSON ({err})") from None
    if not isinstance(source, dict):
        raise RunFolderError(copy, None, COPY_METADATA_KEY, f"expected a JSON object, got {source!r}")
    for key, kind in COPY_SOURCE_FIELDS.items():
        _need(source, key, (kind,), copy, f"{COPY_METADATA_KEY}.{key}")
    if source["version"] != COPY_VERSION or source["source"] != "requests.jsonl":
        raise RunFolderError(copy, None, COPY_METADATA_KEY, f"a copy of {source['source']!r}, version "
                             f"{source['version']} (this tracebench reads copies of 'requests.jsonl', version "
                             f"{COPY_VERSION}): delete it (the report then parses requests.jsonl)")
    return source


def read_columns_copy(jsonl: Path, copy: Path) -> pl.DataFrame:
    """The records of `jsonl` from its columnar copy `copy`, which must be a copy of the file as it is now: the same
    size, and the same mtime or else the same sha256 (a folder copied elsewhere keeps its bytes, not its mtimes).
    Otherwise the read stops, naming the copy: the JSONL changed after the copy was made, or the copy is damaged."""
    source = copy_source(copy)
    stat = jsonl.stat()
    changed = None
    if stat.st_size != source["size"]:
        changed = f"requests.jsonl has {stat.st_size} bytes, the copy was made from {source['size']}"
    elif stat.st_mtime_ns != source["mtime_ns"] and file_sha256_and_lines(jsonl)[0] != source["sha256"]:
        changed = "requests.jsonl has other bytes (sha256) than the copy was made from"
    if changed is not None:
        raise RunFolderError(copy, None, None, f"not a copy of requests.jsonl as it is now ({changed}): "
                             "requests.jsonl changed after the replay made the copy. If that change is meant, delete "
                             f"{copy.name} (the report then parses requests.jsonl, and checks every record)")
    frame = read_parquet_table(copy, request_schema())
    if frame.height != source["rows"]:
        raise RunFolderError(copy, None, None, f"has {frame.height} rows, but was made from {source['rows']} records "
                             "of requests.jsonl: a damaged copy; delete it (the report then parses requests.jsonl)")
    return frame


def _raise_first_broken(path: Path, frame: pl.DataFrame, rules: list[tuple[str, pl.Expr, str]]) -> None:
    """Raise naming the first broken record of `frame` (the lowest row any rule breaks on; of its rules, the first)."""
    first_bad = frame.select(
        [pl.col(ROW).filter(expr.fill_null(False)).min().alias(str(i)) for i, (_, expr, _) in enumerate(rules)]
    ).row(0)
    row, rule_index = min((row, i) for i, row in enumerate(first_bad) if row is not None)
    field, _, why = rules[rule_index]
    value = frame.item(row, field)
    _raise_located(path, row=row, field=field, why=f"{why}, got {value!r}" if value is not None else why)


def read_telemetry(folder: Path) -> pl.DataFrame:
    """telemetry.jsonl or telemetry.parquet of `folder`, on the run clock as written (not converted by speed); a field
    absent from a line (`error` on a good poll) reads as null."""
    path = run_file(folder, "telemetry.jsonl")
    if not path.is_file():
        raise RunFolderError(path, None, None, "missing: the run recorded no telemetry")
    if path.suffix == ".parquet":
        return read_parquet_table(path, telemetry_schema())
    return read_jsonl_table(path, telemetry_schema(), row_index=False)


def read_beside(folder: Path, meta: dict[str, Any], name: str) -> pl.DataFrame | None:
    """server_metrics.jsonl or gpu.jsonl (or their Parquet) of `folder`, on the run clock as written (not converted by
    speed). None when run.json says the run wrote none (`server_metrics.file` / `gpu_telemetry.file` null: not
    scraped, no GPU; a run recorded before tracebench wrote them has neither key)."""
    key = BESIDE_FILES[name]
    info = meta.get(key)
    if info is None or info.get("file") is None:
        return None
    path = run_file(folder, name)
    if not path.is_file():
        raise RunFolderError(path, None, None, f"missing, though run.json {key}.file names it")
    schema = BESIDE_SCHEMAS[name]()
    if path.suffix == ".parquet":
        return read_parquet_table(path, schema)
    return read_jsonl_table(path, schema, row_index=False)


def read_jsonl_table(path: Path, schema: dict[str, Any], row_index: bool) -> pl.DataFrame:
    """One JSONL file of a run folder as a frame of `schema` (with `_row` when asked); a file polars refuses is walked
    again to name the broken line."""
    try:
        return pl.scan_ndjson(path, schema=schema, row_index_name=ROW if row_index else None).collect()
    except pl.exceptions.PolarsError:
        _raise_located(path, row=None, schema=schema)  # names the broken line; returns only when orjson finds nothing
        raise


def read_parquet_table(path: Path, schema: dict[str, Any]) -> pl.DataFrame:
    """A packed table: exactly the columns and types of `schema`, in its order."""
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise RunFolderError(path, None, None, f"not a readable Parquet file ({err})") from None
    for name, dtype in schema.items():
        if name not in frame.schema and name in LATER_COLUMNS:
            frame = frame.with_columns(pl.lit(None, dtype).alias(name))
        if name not in frame.schema:
            raise RunFolderError(path, None, name, "missing column")
        if frame.schema[name] != dtype:
            raise RunFolderError(path, None, name, f"column of type {frame.schema[name]}, expected {dtype}")
    extra = [name for name in frame.columns if name not in schema]
    if extra:
        raise RunFolderError(path, None, extra[0], "not a column of the run format")
    return frame.select(list(schema))


def _json_type_error(schema: dict[str, Any], name: str, value: Any) -> str | None:
    dtype = schema.get(name)
    if value is None or dtype is None:
        return None
    if dtype == pl.Int64:
        good = isinstance(value, int) and not isinstance(value, bool)
        return None if good else f"must be an integer, got {value!r}"
    if dtype == pl.Float64:
        good = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if good else f"must be a number, got {value!r}"
    if dtype == pl.Boolean:
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    return None if isinstance(value, str) else f"must be a string, got {value!r}"


def _raise_located(path: Path, row: int | None, field: str | None = None, why: str | None = None,
                   schema: dict[str, Any] | None = None) -> None:
    """Name the place of a broken record: in a packed file, its row (1-based). In a JSONL file, walk it with orjson
    and raise naming the first broken line: a line that is not a JSON object or holds a field of the wrong type, or
    (when `row` is given) the line of that record. Only on failure."""
    if path.suffix == ".parquet":
        assert row is not None, "a Parquet file is read whole or refused: only a broken record is located"
        raise RunFolderError(path, row + 1, field, why or "broken record")
    schema = request_schema() if schema is None else schema
    record = -1
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                raise RunFolderError(path, lineno, None, "empty line")
            if not raw.endswith(b"\n"):
                why_cut = "last line is cut short (no newline at the end: was the run killed while writing?)"
            else:
                why_cut = None
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                raise RunFolderError(path, lineno, None, why_cut or f"not JSON ({err})") from None
            if not isinstance(obj, dict):
                raise RunFolderError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
            for name, value in obj.items():
                problem = _json_type_error(schema, name, value)
                if problem is not None:
                    raise RunFolderError(path, lineno, name, problem)
            record += 1
            if row is not None and record == row:
                raise RunFolderError(path, lineno, field, why or "broken record")
