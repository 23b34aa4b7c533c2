"""PD disaggregation in the replay (`tracebench replay --pd P:D`, `--attach-prefill`, `--attach-decode`): two pools of
servers behind one router queue, one policy per pool, and a client that sends each request to its (prefill, decode)
pair as sglang-router 0.3.2's PD mode does (.DUCUMENT/pd-disaggregation.md section 7):

- the body gets `bootstrap_host` (the prefill server's host), `bootstrap_port` (its bootstrap port, read from its
  `/server_info` `disaggregation_bootstrap_port`) and `bootstrap_room` (a random integer in [0, 2^63 - 1], drawn from
  the run's seed), appended after the request's own fields;
- the same body is POSTed to the prefill server and the decode server at once; the answer is the decode server's
  stream (first token, chunks, final meta_info); the prefill server's answer (one token, after its KV reached the
  decode server) is read whole and its moment and meta_info recorded too.

A policy is the ordinary Policy of docs/policies.md and sees one pool only: the prefill policy picks among prefill
servers, the decode policy among decode servers, each from the same router queue. Nothing here runs when a run has
no --pd: a plain run's hot path is unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson

from tracebench.errors import ConfigError, ServerStartError
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView
from tracebench.replay.client import Answer, SglangClient, Stamps
from tracebench.replay.router import check_picks
from tracebench.replay.servers import free_ports

ROLES = ("prefill", "decode")
MAX_ROOM = 2**63 - 1   # sglang-router's generate_room_id: a random u64 masked to [0, 2^63 - 1] (pd_types.rs L58-62)
PREFILL_DONE = "prefill_done"   # PairClient.generate yields (PREFILL_DONE, Answer) when the prefill answer is in


def parse_ratio(text: str) -> tuple[int, int]:
    """`--pd P:D`: the number of prefill and decode servers to launch."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if match is None:
        raise ConfigError(f"--pd {text!r}: expected P:D, the number of prefill and decode servers (e.g. 1:1)")
    p, d = int(match.group(1)), int(match.group(2))
    if p < 1 or d < 1:
        raise ConfigError(f"--pd {text}: each pool needs at least one server")
    return p, d


def launch_args(role: str, bootstrap_port: int | None) -> list[str]:
    """sglang's (and the simulator's) flags that make a launched server a PD one (server_args.py L2983-3000)."""
    if role == "prefill":
        assert bootstrap_port is not None
        return ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap_port)]
    return ["--disaggregation-mode", "decode"]


# flags tracebench sets itself on a PD server: --server-arg must not repeat them
OWNED_FLAGS = ("--disaggregation-mode", "--disaggregation-bootstrap-port")


def check_pd_config(cfg: Any, given: set[str]) -> Any:
    """Refuse what a PD run cannot do (ConfigError); fill each pool's policy (default: --policy). `cfg` is a
    ReplayConfig, `given` the fields the user set."""
    if cfg.pd is not None and (cfg.attach_prefill or cfg.attach_decode):
        raise ConfigError("--pd P:D launches the servers, --attach-prefill/--attach-decode use running ones: give one")
    if bool(cfg.attach_prefill) != bool(cfg.attach_decode):
        raise ConfigError("a PD run needs both --attach-prefill URL and --attach-decode URL (each repeatable)")
    urls = [*cfg.attach_prefill, *cfg.attach_decode]
    if len(set(urls)) != len(urls):
        raise ConfigError("--attach-prefill/--attach-decode: the same URL twice (each server once, in one pool)")
    if cfg.pd is not None:
        parse_ratio(cfg.pd)
    for flag, key, why in (
        ("--attach", "attach", "a PD run names its servers with --attach-prefill and --attach-decode"),
        ("--gpus", "gpus", "--pd P:D says how many servers are launched (one GPU each)"),
        ("--batch-size", "batch_size", "static batching is not for PD runs"),
    ):
        if key in given:
            raise ConfigError(f"{flag} cannot be used with PD servers: {why}")
    if cfg.mode != "continuous":
        raise ConfigError("--mode static cannot be used with PD servers (a pair is sent as a request arrives)")
    if cfg.api != "generate":
        raise ConfigError(f"--api {cfg.api}: PD runs speak sglang's /generate (the bootstrap fields are its own)")
    for word in (w for value in cfg.server_args for w in value.split()):
        if word.split("=", 1)[0] in OWNED_FLAGS:
            raise ConfigError(f"--server-arg {word}: tracebench sets it itself on PD servers (--pd)")
    pool_keys = ("prefill_policy", "decode_policy", "prefill_policy_options", "decode_policy_options")
    if cfg.router != "tracebench":
        for key in pool_keys:
            if key in given:
                flag = "--" + key.replace("_options", "-opt").replace("_", "-")
                raise ConfigError(f"{flag} is for tracebench's router; sglang-router's PD mode takes "
                                  "--router-policy, or --router-arg \"--prefill-policy P --decode-policy D\"")
        return cfg
    if "policy_options" in given:
        raise ConfigError("--policy-opt with PD servers: give each pool's options with --prefill-policy-opt and "
                          "--decode-policy-opt")
    return dataclasses.replace(cfg, prefill_policy=cfg.prefill_policy or cfg.policy,
                               decode_policy=cfg.decode_policy or cfg.policy)


def add_pd_launch_args(plans: list[Any], n_prefill: int, port_base: int | None) -> None:
    """Launched PD servers: the first `n_prefill` plans become prefill servers (each with its own bootstrap port:
    port_base + servers + i, or free ports), the others decode servers."""
    if port_base is not None:
        ports = [port_base + len(plans) + i for i in range(n_prefill)]
    else:
        taken = {p.port for p in plans}
        ports = [p for p in free_ports(n_prefill + len(taken)) if p not in taken][:n_prefill]
    for i, plan in enumerate(plans):
        role = "prefill" if i < n_prefill else "decode"
        plan.command += launch_args(role, ports[i] if role == "prefill" else None)
        plan.role = role
        plan.bootstrap_port = ports[i] if role == "prefill" else None  # checked free with the server's own port


def check_unified(index: int, url: str, info: dict[str, Any]) -> None:
    """A server given as a plain one (`--attach`, not PD) must not be a PD prefill or decode server: it refuses every
    request without the bootstrap fields (a run of 100 ended "completed, ok 0, error 100", exit 0)."""
    mode = info.get("disaggregation_mode")
    if mode in ("prefill", "decode"):
        raise ServerStartError(f"server {index} ({url}) is a PD {mode} server (its /server_info says disaggregation_mode "
                               f"{mode!r}): it refuses requests without bootstrap fields; give it with "
                               f"--attach-{mode} (and its {'decode' if mode == 'prefill' else 'prefill'} servers), or "
                               "attach a server started without --disaggregation-mode")


def check_role(index: int, url: str, info: dict[str, Any], role: str) -> int | None:
    """The server's /server_info must say it is a `role` server; returns a prefill server's bootstrap port."""
    mode = info.get("disaggregation_mode")
    if mode != role:
        raise ServerStartError(f"server {index} ({url}) was given as a {role} server but its /server_info says "
                               f"disaggregation_mode {mode!r} (start it with --disaggregation-mode {role})")
    if role == "decode":
        return None
    port = info.get("disaggregation_bootstrap_port")
    if type(port) is not int:
        raise ServerStartError(f"prefill server {index} ({url}): /server_info has no integer "
                               f"disaggregation_bootstrap_port ({port!r})")
    return port


def bootstrap_host(url: str) -> str:
    """The host part of a prefill server's URL: what sglang-router sends as bootstrap_host (worker_builder.rs
    L136-157). The decode server connects to it, so it must be reachable from there."""
    host = urlsplit(url).hostname
    if not host:
        raise ConfigError(f"{url!r}: no host name to send as bootstrap_host")
    return host


class Rooms:
    """bootstrap_room values: uniform in [0, 2^63 - 1] like sglang-router's, from the run's seed (reproducible)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng([seed, 0x5044])  # its own stream: the policies' draws stay as they were

    def next(self) -> int:
        return int(self._rng.integers(0, MAX_ROOM, endpoint=True))


def with_bootstrap(body: bytes, host: str, port: int, room: int) -> bytes:
    """The request body with the three bootstrap fields added after its own (as sglang-router inserts them)."""
    if not body.endswith(b"}"):
        raise ValueError("a /generate body is a JSON object")
    extra = orjson.dumps({"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room})
    return body[:-1] + b"," + extra[1:]


# ---- the pools ----------------------------------------------------------------------------------------------------

class PdPolicies(Policy):
    """The two pools' policies of a PD run through tracebench's router, each loaded like --policy with its own
    seeded generator; this object only names them in run.json (`policy`) and the run's name. PdRouter asks each."""

    name = "pd"
    description = "PD disaggregation: a policy per pool (--prefill-policy, --decode-policy)"

    def __init__(self, cfg: Any) -> None:
        from tracebench.policies.registry import load_policy

        super().__init__(np.random.default_rng(cfg.seed))
        self.prefill = load_policy(cfg.prefill_policy, np.random.default_rng([cfg.seed, 1]),
                                   dict(cfg.prefill_policy_options))
        self.decode = load_policy(cfg.decode_policy, np.random.default_rng([cfg.seed, 2]),
                                  dict(cfg.decode_policy_options))
        self.name = f"{self.prefill.name}-{self.decode.name}"  # type: ignore[misc]

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        raise RuntimeError("PdRouter asks each pool's policy, never PdPolicies")

    def describe(self) -> dict[str, Any]:
        return {"name": f"prefill {self.prefill.name}, decode {self.decode.name}", "class": "PdPolicies",
                "options": {}, "settings": {}, "prefill": self.prefill.describe(), "decode": self.decode.describe()}


def _checked(policy: Policy, picks: Any, queue: Sequence[QueuedRequest], views: Sequence[ServerView],
             pool: str) -> list[Assignment]:
    """One pool's picks, checked by the router's rules (router.check_picks; the PolicyError names the pool)."""
    by_index = {v.index: v for v in views}
    check_picks(f"{policy.name!r} ({pool} pool)", picks, {q.id: q for q in queue}, by_index.get)
    return picks


def assign_pairs(queue: Sequence[QueuedRequest], prefill_policy: Policy, decode_policy: Policy,
                 prefill_views: Sequence[ServerView], decode_views: Sequence[ServerView]
                 ) -> list[tuple[QueuedRequest, ServerView, ServerView]]:
    """One assignment round: the prefill policy picks prefill servers for requests of the queue, then the decode
    policy picks decode servers for those requests (the queue it sees: them, oldest first). A request gets a pair
    only when both picked; one the decode policy leaves waits in the router queue, and the prefill policy is asked
    about it again in a later round."""
    prefill = _checked(prefill_policy, prefill_policy.assign(queue, prefill_views), queue, prefill_views, "prefill")
    if not prefill:
        return []
    picked = {req.id: view for req, view in prefill}
    sub_queue = [q for q in queue if q.id in picked]
    decode = _checked(decode_policy, decode_policy.assign(sub_queue, decode_views), sub_queue, decode_views, "decode")
    return [(req, picked[req.id], view) for req, view in decode]


# ---- the client ---------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class PrefillAnswer:
    """How the prefill server's answer ended, and its meta_info (status ok only)."""

    answer: Answer


# yielded by PairClient.generate when the decode server's answer is whole before the prefill server's: from then on
# the pair waits on its prefill server alone (Router.watch)
DECODE_DONE = "decode_done"


class PairClient:
    """Sends one request to a (prefill, decode) pair at once and merges the two answers into one stream of items:
    the decode server's FIRST_TOKEN and CHUNK (SglangClient.generate), DECODE_DONE if its answer is whole before the
    prefill server's, a PrefillAnswer when the prefill server's answer is complete, then exactly one Answer: the decode server's, or the failure that ended the pair. A failed
    prefill answer ends the pair at once (the decode request is closed, as sglang-router returns the prefill's error
    and drops the decode stream); a failed decode answer too (the prefill request is closed)."""

    def __init__(self, client: SglangClient) -> None:
        self.client = client

    async def generate(self, prefill_url: str, decode_url: str, body: bytes, stamps: Stamps | None = None,
                       now: Callable[[], float] | None = None) -> AsyncIterator[Any]:
        """`stamps`/`now`: as SglangClient.generate's, for the decode request (the one whose stream is read); the
        prefill request's moments are the record's prefill_* fields."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def pump(who: str, url: str) -> None:
            async for item in self.client.generate(url, body, *((stamps, now) if who == "decode" else ())):
                queue.put_nowait((who, item))

        # both sent at once, the prefill first (sglang-router: tokio::join!(prefill.send(), decode.send()))
        tasks = [asyncio.ensure_future(pump("prefill", prefill_url)), asyncio.ensure_future(pump("decode", decode_url))]
        decode_answer: Answer | None = None
        prefill_seen = False
        try:
            while True:
                who, item = await queue.get()
                if who == "prefill":
                    if not isinstance(item, Answer):
                        continue   # the prefill server's stream chunks: only its whole answer matters
                    prefill_seen = True
                    yield PrefillAnswer(item)
                    if item.status != "ok":
                        # the pair ends with the prefill's failure (PrefillAnswer says whether its server was lost)
                        yield Answer(item.status, f"prefill server: {item.error}")
                        return
                    if decode_answer is not None:
                        yield decode_answer
                        return
                elif isinstance(item, Answer):
                    if item.status != "ok" or prefill_seen:
                        yield item if item.status == "ok" else Answer(item.status, f"decode server: {item.error}",
                                                                      connection_lost=item.connection_lost)
                        return
                    decode_answer = item   # the prefill's answer is still to come: the pair ends with both
                    yield DECODE_DONE
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


# ---- the servers' PD counters (/metrics), read before and after the run ----------------------------------------

# sglang 0.5.17's PD families (.DUCUMENT/pd-disaggregation.md section 4) and the generic counters, summed over their
# label sets; histograms as _sum and _count, per_stage_req_latency_seconds per stage
_HISTOGRAMS = ("kv_transfer_latency_ms", "kv_transfer_total_mb", "kv_transfer_speed_gb_s", "kv_transfer_bootstrap_ms",
               "kv_transfer_alloc_ms", "queue_time_seconds", "time_to_first_token_seconds")
_COUNTERS = ("num_requests_total", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
             "num_bootstrap_failed_reqs_total", "num_transfer_failed_reqs_total", "num_aborted_requests_total")
_LINE = re.compile(r"^sglang:(\w+?)(_sum|_count|_bucket)?(?:\{([^}]*)\})? (\S+)$", re.M)


def parse_pd_metrics(text: str) -> dict[str, float]:
    """The PD-relevant figures of one /metrics page: `name` for counters, `name_sum` / `name_count` for histograms,
    `stage:<stage>_sum` / `_count` for sglang:per_stage_req_latency_seconds. Absent families are absent keys."""
    out: dict[str, float] = {}
    for name, suffix, labels, value in _LINE.findall(text):
        if suffix == "_bucket":
            continue
        if name == "per_stage_req_latency_seconds" and suffix:
            stage = re.search(r'stage="([^"]*)"', labels or "")
            if stage is None:
                continue
            key = f"stage:{stage.group(1)}{suffix}"
        elif (suffix and name in _HISTOGRAMS) or (not suffix and name in _COUNTERS):
            key = f"{name}{suffix}"
        else:
            continue
        out[key] = out.get(key, 0.0) + float(value)
    return out


def metrics_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """after - before for every key in `after` (a key absent before counts from 0: a family appears once observed)."""
    if before is None or after is None:
        return None
    return {key: value - before.get(key, 0.0) for key, value in sorted(after.items())}


async def read_pd_metrics(client: SglangClient, urls: Sequence[str], timeout: float
                          ) -> list[tuple[dict[str, float] | None, str | None]]:
    """Each server's figures now, or why they could not be read."""
    fetched = await asyncio.gather(*(client.get_text(f"{url}/metrics", timeout) for url in urls))
    return [(None, f.error) if f.error is not None else (parse_pd_metrics(f.obj), None) for f in fetched]
