"""`tracebench replay` and `tracebench policies`. Light at import time (`tracebench --help` imports every commands
module): the replay machinery (aiohttp, numpy) is imported inside the commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from tracebench.errors import ConfigError
from tracebench.options import FINITE, INT, SEED
from tracebench.replay.kv_link import HELP as KV_LINK_HELP

if TYPE_CHECKING:
    from tracebench.replay.run import ReplayConfig

_F = TypeVar("_F", bound=Callable[..., Any])


def _policy_opts(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--policy-opt {value!r}: expected KEY=VALUE")
        pairs.append((key.strip(), val))
    return tuple(pairs)


REPLAY_OPTIONS: dict[str, Callable[[_F], _F]] = {
    "policy": click.option("--policy", default="random", show_default=True,
        help="Routing policy: a built-in (`tracebench policies`), path/to/file.py:ClassName, or NAME for "
             "policies/NAME.py."),
    "policy_opts": click.option("--policy-opt", "policy_opts", multiple=True, metavar="KEY=VALUE",
        help="An option of the policy (repeatable); `tracebench policies` lists what each accepts."),
    "gpus": click.option("--gpus", type=INT, default=None,
        help="Launch N servers, one per GPU (CUDA_VISIBLE_DEVICES=i, port base+i). [default: 1]"),
    "backend": click.option("--backend", type=click.Choice(["sglang", "sim"]), default=None,
        help="What to launch: real sglang (`python -m sglang.launch_server`, needs --model) or tracebench's "
             "simulated server (`tracebench sim-server`: a simulated N-GPU cluster). [default: sglang]"),
    "clock": click.option("--clock", type=click.Choice(["real", "virtual"]), default="real", show_default=True,
        help="real: the run takes the trace's own time (servers launched or attached, over HTTP). virtual: the "
             "simulated cluster (--backend sim, implied) runs inside tracebench's process on a simulated clock "
             "that jumps from event to event: no HTTP, no sockets, no host time in the measurement; the same "
             "router, policies, caps, --cap-schedule, static batching and records as a real-time run, as fast as "
             "the host computes it (a byte-identical requests.jsonl for the same trace, options and seed). The "
             "HTTP hops a real client sees are added as the profile's constants (run.json virtual_clock). PD "
             "pools (--pd P:D, --kv-link) run on it too. Not with --attach, --backend sglang, --router "
             "sglang-router, --api completions|chat, --speed or --control-port (docs/virtual-clock.md)."),
    "attach": click.option("--attach", multiple=True, metavar="URL",
        help="Use a running server instead of launching (repeatable: one per server), e.g. "
             "http://127.0.0.1:30000. Needs --vocab-size or --model unless the server is a tracebench simulator "
             "(the run records it as simulated; for a compressed run use --backend sim --speed K)."),
    "mode": click.option("--mode", type=click.Choice(["continuous", "static"]), default="continuous", show_default=True,
        help="continuous: each request is sent at its arrival time. static: static batching, a server gets "
             "its next batch of --batch-size only after every request of the previous one finished."),
    "batch_size": click.option("--batch-size", type=INT, default=None, help="Static mode: requests per batch."),
    "batch_timeout": click.option("--batch-timeout", type=FINITE, default=None, metavar="S",
        help="Static mode: a partial batch goes S seconds after its first request arrived (trace seconds: "
             "S/K run seconds at --speed K). [default: it waits until full, or until the trace has nothing "
             "more to release]"),
    "max_running_requests": click.option("--max-running-requests", type=INT, default=None, metavar="N",
        help="Per-server cap at tracebench's router (at most N in flight per server). The servers "
             "tracebench launches get --max-running-requests max(N, every cap of --cap-schedule): sglang "
             "cannot raise it after launch. A cap raised through the control endpoint above that launch value "
             "is recorded as a cap_above_launch event in run.json (the server itself runs at most its launch "
             "value; the rest wait in its own queue). With --router sglang-router it is only the launched "
             "servers' own --max-running-requests (there is no router cap). [default: no cap]"),
    "max_concurrency": click.option("--max-concurrency", type=INT, default=None, metavar="N",
        help="The benchmark client's own limit (sglang bench_serving's --max-concurrency): at most N requests "
             "in flight across the run, every policy, mode and router. A request released while N are "
             "unfinished waits at the client, in arrival order, until one finishes; only then does it enter "
             "the router queue (the policy never sees it before). Its wait is recorded (t_admitted - "
             "t_released) and reported as the client wait. Not the servers' --max-running-requests, which "
             "acts after it. [default: no limit]"),
    "cap_schedule": click.option("--cap-schedule", default=None, metavar="SPEC",
        help='Change caps during the run: "30s:8,60s:server1=2" (at 30 s every server\'s cap becomes 8, at '
             "60 s server 1's becomes 2; times are trace seconds, i.e. run seconds unless --speed K divides "
             "them by K; all=N means every server). With "
             "--max-running-requests, launched servers get the largest of these caps at launch; a raise "
             "through the control endpoint above it is recorded as a cap_above_launch event."),
    "control_port": click.option("--control-port", type=INT, default=None, metavar="P",
        help='Port of the localhost control endpoint: POST /cap {"server": i|"all", "max_running_requests": n}, '
             "GET /caps. Printed at start. [default: a free port]"),
    "model": click.option("--model", default=None, metavar="PATH",
        help="Model folder for --backend sglang (--model-path); its config.json gives the vocabulary size of "
             "the input ids (also usable with --attach). [default for --backend sglang: $TRACEBENCH_MODEL]"),
    "vocab_size": click.option("--vocab-size", type=INT, default=None, metavar="V",
        help="Vocabulary size for --attach (input ids stay below it), or for the simulator (passed to it)."),
    "server_args": click.option("--server-arg", "server_args", multiple=True, metavar="ARG",
        help='Extra argument(s) for each launched server, split like a shell (repeatable), e.g. '
             '--server-arg "--load-format dummy --attention-backend triton". [default for --backend sglang: '
             '$TRACEBENCH_SERVER_ARGS]'),
    "port_base": click.option("--port-base", type=INT, default=None, metavar="PORT",
        help="Launched server i listens on 127.0.0.1:PORT+i (a port already in use there is refused: another "
             "server would answer for the one tracebench launches). [default: free ports, drawn at random from "
             "20000-32000, so runs at the same time do not collide; run.json servers[].url says which]"),
    "speed": click.option("--speed", type=FINITE, default=None, metavar="K",
        help="--backend sim: compress the whole run K times (0.001 <= K <= 1000000). The simulated GPUs run K "
             "times faster, request i "
             "is released at arrival_s/K run seconds, and the other trace-time options (--cap-schedule times, "
             "--batch-timeout, --timeout) are divided by K (--poll-interval and --startup-timeout stay run "
             "seconds). requests.jsonl stays on the run clock (t_arrival = arrival_s/K); run.json records "
             "\"speed\": K, and `tracebench report` shows such a run in simulated seconds (the simulators' time x K, "
             "tracebench's own host time as measured). The progress line shows simulated units too."),
    "sim_profile": click.option("--sim-profile", default=None, metavar="NAME|PATH",
        help="--backend sim: the simulators' timing profile (sim-server --profile): llama-2-7b-h200-triton, "
             "llama-2-7b-h100-triton, or a profile JSON file. run.json and the report name it. "
             "[default: llama-2-7b-h200-triton]"),
    "sim_gpu": click.option("--sim-gpu", default=None, metavar="NAME",
        help="--backend sim: choose the profile by the GPU it stands in for (sim-server --gpu), e.g. H100 or "
             "the accelerator a real run recorded (run.json servers[].accelerator)."),
    "run_name": click.option("--run-name", default=None, metavar="NAME",
        help="Run folder name; a folder of that name is never overwritten (refused), except one whose run never "
             "started (run.json status not_started: no request was sent), which a retry replaces, saying so. "
             "[default: <trace>-<policy>-<mode>-<N>g-<YYYYmmdd-HHMMSS>, with -2, -3, ... when "
             "that folder exists (two replays started in the same second); no <policy>- for one server without "
             "a cap, where it decides nothing]"),
    "out_dir": click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("reports"),
        show_default=True, help="Where run folders go."),
    "timeout": click.option("--timeout", type=FINITE, default=None, metavar="S",
        help="A request without a complete answer S seconds after dispatch is recorded as timeout (trace "
             "seconds: S/K run seconds at --speed K). [default: no limit; the stall bound, --stall-timeout, "
             "still applies]"),
    "stall_timeout": click.option("--stall-timeout", type=FINITE, default=None, metavar="S",
        help="The stall bound (trace seconds: S/K run seconds at --speed K). A server that shows no progress "
             "for S while requests wait on it (no stream event, no answer, no new /v1/loads snapshot of its "
             "scheduler) is taken out of routing and its requests in flight recorded as timeout; a streamed "
             "request that got its first token and then nothing for S is recorded as timeout. A request is "
             "never cut while its server shows progress: waiting in a busy server's own queue (before the first "
             "token, or for a whole answer without streaming) is its time to first token, bounded only by its "
             "server's progress and --timeout. Behind sglang-router without streaming (no polls there) a "
             "request is timeout when no answer came from the router for S plus the trace's longest output at "
             "5 tokens/s. A policy that assigns nothing for S while servers have free slots fails the run. "
             "run.json stall says what was used. [default: from the trace: max(60 s, twice the longest prompt "
             "at 1000 tokens/s); at least 5 s of run time]"),
    "stream": click.option("--stream/--no-stream", default=True, show_default=True,
        help="Stream answers (gives time to first token) or wait for whole answers."),
    "api": click.option("--api", type=click.Choice(["generate", "completions", "chat"]), default="generate", show_default=True,
        help="The HTTP API the requests speak. generate: sglang's POST /generate with input_ids. completions: "
             "POST /v1/completions with the token ids as prompt (exact lengths). chat: POST "
             "/v1/chat/completions, one user message of input_len words w<id> (exact lengths with the word-level "
             "tokenizer: one word one token; records' prompt_tokens show any difference). The OpenAI APIs "
             "need a server with a tokenizer: launched sglang gets no --skip-tokenizer-init then (put a "
             "tokenizer in the model folder); their answers carry no meta_info, so server_* stamps stay null."),
    "seed": click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the policy's random choices."),
    "sjf_key": click.option("--sjf-key", type=click.Choice(["output", "input"]), default=None,
        help="--policy sjf: order by output_len (its default) or input_len."),
    "poll_interval": click.option("--poll-interval", type=FINITE, default=0.5, show_default=True, metavar="S",
        help="Run seconds between /v1/loads polls (telemetry.jsonl; what policies see as the servers' "
             "reports); not divided by --speed."),
    "keepalive": click.option("--keepalive", type=FINITE, default=4.0, show_default=True, metavar="S",
        help="A connection of the client's pool idle for more than S run seconds is closed, not reused: keep it "
             "below the servers' own keep-alive (sglang's uvicorn closes an idle connection after 5 s, "
             "SGLANG_TIMEOUT_KEEP_ALIVE), or a request can be written into a connection the server is closing "
             "and fail (Connection reset by peer)."),
    "senders": click.option("--senders", type=INT, default=1, show_default=True, metavar="N",
        help="Processes that carry the requests. 1: the router's own process builds, writes and reads every "
             "request (enough up to a few hundred req/s: watch run.json client_keepup). N > 1: the router "
             "(queue, policy, caps, records) stays one process and hands each request to one of N sender "
             "processes, each with its own event loop and connections, which build the body, send it, read the "
             "stream and send the stamps back; every stamp stays on the run's one clock (this host's monotonic "
             "clock). The router still sends a request itself while it keeps up (--router-sends-under). Useful "
             "only with spare cores (about N + 1). A sender process that dies stops the run "
             "(status failed; its requests in flight recorded as errors). Not with --clock virtual or PD "
             "(docs/replay.md, \"Parallel senders\")."),
    "router_sends_under": click.option("--router-sends-under", type=FINITE, default=0.001, show_default=True,
        metavar="S",
        help="--senders N > 1: the router still sends requests itself (no hand-over to a sender process) while it "
             "keeps up: while no more than a quarter of the recent requests had more than S seconds of "
             "tracebench's own time before the hand-over (since their arrival, less the waits the run asked "
             "for); past that, a growing share goes to the sender processes. 0: every request goes through a "
             "sender process. run.json senders counts who carried how many."),
    "pin_cpus": click.option("--pin-cpus", default=None, metavar="LIST",
        help="Linux: pin the router to the first CPU of LIST (e.g. 0-8 or 0,2,4), alone, and the sender processes "
             "of --senders N > 1 to the others (at least one more; with --senders 1 LIST is one CPU), so that no "
             "sender process or server takes the router's core: a wake-up of a sender process on the router's "
             "core preempts the router and delays the next release. Keep the servers off LIST (e.g. taskset). "
             "Each CPU must be one this process may run on. [default: no pinning]"),
    "ray": click.option("--ray", default=None, metavar="ADDRESS",
        help="Launch the servers of --gpus N (--backend sglang or sim) on a Ray cluster: one Ray actor per server, "
             "each holding one of the cluster's GPUs (num_gpus=1, spread over the nodes), which starts the server "
             "on its node and reports its address; tracebench's router, here, speaks HTTP to them as to any "
             "server. ADDRESS: the cluster's head (host:port, or auto). run.json servers[] names each server's "
             "node and its measured clock offset; a server lost with its node is a fault the run reports "
             "(server_down, its requests in flight recorded as errors). Needs the extra: pip install "
             "'tracebench[ray]', and tracebench on every node. Not with --attach, --pd, --port-base, --clock "
             "virtual (docs/ray.md)."),
    "metrics_interval": click.option("--metrics-interval", type=FINITE, default=1.0, show_default=True, metavar="S",
        help="Run seconds between two scrapes of each server's /metrics (sglang's Prometheus counters, gauges "
             "and histograms) into server_metrics.jsonl, with each server's whole text at the start and end "
             "(metrics-<i>-start.txt, -end.txt); 0: no scrape. Behind sglang-router the servers themselves "
             "are scraped. Real sglang holds its token streams while it serves a scrape (~16 ms on an H200 "
             "host): for the latency tail of short answers, use 0 (docs/replay.md). Beside it, when nvidia-smi "
             "is on PATH (or TRACEBENCH_NVIDIA_SMI names it) and a real server runs on this host, GPU "
             "utilisation, memory and power every second into gpu.jsonl."),
    "startup_timeout": click.option("--startup-timeout", type=FINITE, default=None, metavar="S",
        help="Seconds a launched server may take to answer /health 200. [default: 600 sglang, 30 sim]"),
    "flush_cache": click.option("--flush-cache/--no-flush-cache", default=True, show_default=True,
        help="Empty every server's prefix (radix) cache before the run starts (POST /flush_cache), so runs of "
             "one trace start from the same cache state. A server that refuses (sglang does while requests "
             "run or wait there) stops the run before it starts."),
    "quiet": click.option("--quiet", is_flag=True, default=False, help="No progress line on stderr."),
    "router": click.option("--router", type=click.Choice(["tracebench", "sglang-router"]), default="tracebench", show_default=True,
        help="Who picks the server. tracebench: its own router and --policy. sglang-router: sglang's own "
             "router (sglang-router 0.3.2, `pip install 'tracebench[router]'`), launched after the servers on "
             "127.0.0.1 with --disable-retries --disable-circuit-breaker; every request is sent to it on "
             "arrival (t_dispatch = sent to sglang-router) and it picks the server, so records have server "
             "null and the per-server figures come from each server's /metrics counters (run.json "
             "external_router). With it, --max-running-requests is only the launched servers' own cap "
             "(sglang queues the rest), and --policy, --policy-opt, --sjf-key, --cap-schedule, --control-port "
             "and --mode static are refused."),
    "router_policy": click.option("--router-policy", type=click.Choice(["cache_aware", "round_robin", "random", "power_of_two"]),
        default=None, help="--router sglang-router: its --policy. [default: cache_aware, its own default]"),
    "router_args": click.option("--router-arg", "router_args", multiple=True, metavar="ARG",
        help='--router sglang-router: extra argument(s) for it, split like a shell (repeatable), e.g. '
             '--router-arg "--cache-threshold 0.5 --balance-abs-threshold 32". tracebench sets --host, --port, '
             "--worker-urls, --policy, --prometheus-host/--prometheus-port, --log-level, --disable-retries "
             "and --disable-circuit-breaker itself."),
    "pd": click.option("--pd", default=None, metavar="P:D",
        help="PD disaggregation: launch P prefill and D decode servers, one GPU each (sglang's "
             "--disaggregation-mode prefill|decode, each prefill server with its own "
             "--disaggregation-bootstrap-port; the transfer backend is sglang's default, mooncake, unless "
             "--server-arg \"--disaggregation-transfer-backend mooncake_tcp\"). With --backend sim, simulated "
             "PD servers (with --clock virtual, inside tracebench's process). Each request goes to one prefill and one decode server (--prefill-policy, "
             "--decode-policy), both sent the same body with bootstrap_host/port/room as sglang-router's PD "
             "mode sends it; the answer is the decode server's stream (docs/pd.md)."),
    "kv_link": click.option("--kv-link", default=None, metavar="PRESET|BW:LAT", help=KV_LINK_HELP),
    "attach_prefill": click.option("--attach-prefill", multiple=True, metavar="URL",
        help="PD: a running prefill server (repeatable); its bootstrap port is read from its /server_info."),
    "attach_decode": click.option("--attach-decode", multiple=True, metavar="URL", help="PD: a running decode server (repeatable)."),
    "prefill_policy": click.option("--prefill-policy", default=None,
        help="PD: the prefill pool's policy (any --policy value; it sees only prefill servers). [default: --policy]"),
    "decode_policy": click.option("--decode-policy", default=None,
        help="PD: the decode pool's policy (it sees only decode servers). [default: --policy]"),
    "prefill_policy_opts": click.option("--prefill-policy-opt", "prefill_policy_opts", multiple=True, metavar="KEY=VALUE",
        help="PD: an option of the prefill pool's policy (repeatable)."),
    "decode_policy_opts": click.option("--decode-policy-opt", "decode_policy_opts", multiple=True, metavar="KEY=VALUE",
        help="PD: an option of the decode pool's policy (repeatable)."),
    "saturation_window": click.option("--saturation-window", type=FINITE, default=None, metavar="S",
        help="Stop the run early when it is over-saturated (requests arrive faster than the servers finish them: "
             "judged over windows of S trace seconds, the outstanding count grows with a significant slope and "
             "leaves >= 15% of two windows' arrivals behind; docs/sweep.md). Requests never sent are recorded "
             "not_sent, those in flight cancelled; run.json status saturated. [default: never stop]"),
}


def replay_options(skip: Iterable[str] = (), replace: Mapping[str, Callable[[_F], _F]] | None = None) -> Callable[[_F], _F]:
    """The options of `tracebench replay` as one decorator, so another command that runs replays (`tracebench sweep`)
    takes the same options with the same help: `skip` leaves some out, `replace` gives one its own definition (same
    parameter name). Options keep REPLAY_OPTIONS' order in --help."""
    replace = dict(replace or {})
    unknown = (set(skip) | set(replace)) - set(REPLAY_OPTIONS)
    assert not unknown, f"not replay options: {sorted(unknown)}"

    def apply(command: _F) -> _F:
        for name, option in reversed(REPLAY_OPTIONS.items()):
            if name not in skip:
                command = replace.get(name, option)(command)
        return command

    return apply


# click parameter -> ReplayConfig field, where the option gives KEY=VALUE pairs
_PAIR_OPTIONS = {"policy_opts": "policy_options", "prefill_policy_opts": "prefill_policy_options",
                 "decode_policy_opts": "decode_policy_options"}


def replay_config(ctx: click.Context, trace: Path, options: Mapping[str, Any]) -> ReplayConfig:
    """The ReplayConfig of the parsed replay options (`options`: click parameter name -> value, as replay_options
    defines them; a name ReplayConfig does not know is a TypeError: a bug)."""
    from tracebench.options import copy_min_bytes
    from tracebench.replay.run import ReplayConfig

    copy_min_bytes()  # the columnar copy's threshold, read at the run's end: a bad value stops it before it starts

    values = dict(options)
    if values["router"] != "tracebench" and ctx.get_parameter_source("policy") is not click.core.ParameterSource.DEFAULT:
        raise ConfigError(f"--policy is tracebench's router; with --router {values['router']} give --router-policy")
    for option, field in _PAIR_OPTIONS.items():
        if option in values:
            values[field] = _policy_opts(values.pop(option))
    return ReplayConfig(trace=trace, **values)


@click.command("replay")
@click.argument("trace", type=click.Path(path_type=Path, dir_okay=False))
@replay_options()
@click.option("--adapt-speed", is_flag=True, default=False,
    help="--backend sim --speed K, K > 1 (at speed 1 there is nothing to lower: refused): when the host cannot hold "
         "K (the run's lag could account for more than the "
         "report's Host lag bound, 6%, of TTFT or total latency p50/p99), delete the run and make it again from the "
         "start at a lower K (K/2 or less, from the lag measured; down to 1), saying so here; run.json "
         "speed_guard records the K asked for, the K used and each attempt. When even speed 1 misses the bound "
         "(the host too busy for real time), that run is kept, flagged (speed_guard.held false) and warned about: "
         "there is no lower K. [default: K is kept; the report warns]")
@click.pass_context
def replay(ctx: click.Context, trace: Path, adapt_speed: bool, **options: Any) -> Path:
    """Replay TRACE against sglang servers (launched or attached) and record every request.

    \b
    Each request is released at its arrival time (an absolute schedule) into tracebench's router; the policy
    sends it to a server under the per-server cap; its three moments are recorded (t_released, t_dispatch,
    t_finish, plus t_first_token and sglang's own stamps).
    Closed loop: a request with the trace fields after = ID and delay_s = S (generate --workload multi-turn
    --closed-loop) has no arrival time of its own: it is released S seconds after request ID finished (ok or
    not), as a user sends the next turn after reading the answer; its arrival_s is only the generator's
    open-loop estimate and is not used. So a closed-loop trace offers load at the pace the servers answer: a
    faster run is sent its later turns sooner, and the report warns that throughput then measures speed, not
    load handled (docs/replay.md, "Closed loop"). The run folder <out-dir>/<run-name>/ holds
    run.json, requests.jsonl, telemetry.jsonl, server_metrics.jsonl (and gpu.jsonl on a GPU host) and the servers'
    logs (docs/run-format.md); a big run (requests.jsonl of 32 MiB or more) that ended cleanly also gets, before its
    folder is printed, requests.columns.parquet: the same records in columns, which `tracebench report` reads
    instead of parsing the JSONL.
    --speed K (simulator) compresses the whole run K times: every trace time is divided by K, and
    `tracebench report` shows the run in simulated seconds (the simulators' time x K, the host's as measured).
    \b
    Every answer is checked against the trace: a request is ok only when the server generated output_len
    tokens and counted input_len prompt tokens. Otherwise its status is mismatch and its record's mismatch
    field says what and why, e.g. sglang 0.5.17 clips max_new_tokens to context_len - 1 - input_len - 1, so
    the whole output comes only when input_len + output_len <= context_len - 2 (4094 for a 4096 context).
    The final line counts each status, mismatches by reason.
    \b
    tracebench replay t.jsonl --backend sim --gpus 2 --speed 4 --policy sjf --max-running-requests 16
    tracebench replay t.jsonl --backend sim --gpus 4 --speed 4 --adapt-speed --max-running-requests 24
    tracebench replay t.jsonl --model models/llama-2-7b-hf --gpus 4 --policy round_robin \\
        --server-arg "--load-format dummy --attention-backend triton --sampling-backend pytorch"
    tracebench replay t.jsonl --backend sim --mode static --batch-size 8
    tracebench replay t.jsonl --attach http://127.0.0.1:30000 --model models/llama-2-7b-hf
    tracebench replay t.jsonl --backend sim --gpus 4 --speed 4 --router sglang-router --router-policy cache_aware
    tracebench replay t.jsonl --backend sim --pd 1:1 --speed 4 --prefill-policy cache_aware
    tracebench replay t.jsonl --attach-prefill http://127.0.0.1:30000 --attach-decode http://127.0.0.1:30001 \\
        --model models/llama-2-7b-hf --router sglang-router --router-policy round_robin
    \b
    Ctrl-C stops the run: requests in flight are cancelled and recorded, servers are stopped, exit code 130
    (143 for SIGTERM). Exit codes: 0 completed, 1 failed, 2 bad input (docs/replay.md, "Guarantees").
    """
    from tracebench.replay.run import run_replay

    cfg = replay_config(ctx, trace, options)
    # the run folder is printed by tracebench/cli.py, once it has its columnar copy (above replay/: polars)
    if adapt_speed:
        from tracebench.speedguard import adapt

        return adapt(cfg, run_replay, sys.stderr)
    return run_replay(cfg, sys.stderr)  # the stream of the call (not bound at import)


@click.command("policies")
def policies_cmd() -> None:
    """List the built-in routing policies (use one with `tracebench replay --policy NAME`), laid out for the
    terminal's width (COLUMNS, else the terminal's, else 120).

    A policy of your own: `--policy path/to/file.py:ClassName`, or a file in policies/ by name
    (policies/example_least_loaded.py is a commented example; docs/policies.md is the guide).
    """
    import textwrap

    from tracebench.policies.registry import builtin_policies
    from tracebench.termwidth import terminal_width

    width = terminal_width()
    policies = builtin_policies()
    name_width = max(len(name) for name in policies)

    def lines(first: str, text: str, indent: int) -> list[str]:
        # the text wraps under itself, at the terminal's width (COLUMNS)
        return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=" " * indent,
                             break_on_hyphens=False) or [first]

    out: list[str] = []
    for name, cls in policies.items():
        out += lines(f"{name:<{name_width}}  ", cls.description, name_width + 2)
        for key, text in cls.options_help.items():
            out += lines(f"{'':<{name_width}}    --policy-opt {key}=...: ", text, name_width + 8)
    out += ["", *lines("  ", "sglang's own router as the reference, instead of --policy (`pip install "
                             "'tracebench[router]'`):", 4),
            *lines("    ", "--router sglang-router --router-policy cache_aware|round_robin|random|power_of_two", 6),
            *lines("    ", "(runs named sglang-router-<policy>; how its cache_aware decides: "
                           ".DUCUMENT/sglang-router.md)", 5)]
    click.echo("\n".join(out))
