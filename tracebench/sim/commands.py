"""`tracebench sim-server`: the CLI of the simulated sglang server. Heavy imports (aiohttp) happen inside the command."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from tracebench.errors import ConfigError
from tracebench.sim.args import (
    DEFAULT_BOOTSTRAP_PORT, DEFAULT_KV_BANDWIDTH_GIB_S, DEFAULT_KV_LATENCY_S, DISAGGREGATION_MODES, TRANSFER_BACKENDS,
)
from tracebench.options import FINITE, INT, SEED, SPEED_RANGE

if TYPE_CHECKING:
    from tracebench.sim.args import SimArgs


def check_can_listen(host: str, port: int, flag: str = "--port") -> None:
    """A ConfigError (one line, exit 2) naming the address when the server could not listen there: a --host that is
    no address of this machine, a --port taken. Bound as the server binds it (every address of the host,
    SO_REUSEADDR), then let go at once; the server binds it a moment later."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ConfigError(f"--host {host!r}: not an address to listen on ({err.strerror})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
                sock.listen(1)
            except OSError as err:
                raise ConfigError(f"--host {host} {flag} {port}: cannot listen there ({err.strerror})") from None


@click.command("sim-server")
@click.option("--port", type=INT, required=True, help="TCP port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--profile", "profile_name", default=None,
              help="Timing profile: a name in tracebench/sim/profiles/ (llama-2-7b-h200-triton, "
                   "llama-2-7b-h100-triton) or a path to a profile JSON file. [default: llama-2-7b-h200-triton]")
@click.option("--gpu", default=None, metavar="NAME",
              help="Choose the profile by the GPU it stands in for instead: the built-in profile whose accelerator "
                   "has every word of NAME (H100 -> llama-2-7b-h100-triton, H200 -> llama-2-7b-h200-triton).")
@click.option("--speed", type=FINITE, default=1.0, show_default=True,
              help="Run K times faster than the GPU would: every duration is divided by K (stamps stay wall-clock); "
                   "0.001 <= K <= 1000000.")
@click.option("--max-running-requests", type=INT, default=None,
              help="At most N requests run at once (sglang's flag). Default: the profile's (sglang: 4096).")
@click.option("--max-total-tokens", type=INT, default=None,
              help="KV cache capacity in tokens (sglang's flag). Default: the profile's GPU capacity.")
@click.option("--context-length", type=INT, default=4096, show_default=True, help="Model context length.")
@click.option("--chunked-prefill-size", type=INT, default=8192, show_default=True,
              help="At most this many new input tokens per prefill step; longer inputs are prefilled in chunks.")
@click.option("--startup-delay", type=FINITE, default=0.0, show_default=True,
              help="Seconds during which /health answers 503 (sglang loading), before 200.")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the output ids (same seed and request order: same ids).")
@click.option("--vocab-size", type=INT, default=32000, show_default=True, help="Input ids must be below this.")
@click.option("--crash-on-bad-token", is_flag=True, default=False,
              help="An input id >= vocab size kills the process (exit 134, connections drop), like real sglang. "
                   "Default: answer 400.")
@click.option("--enable-metrics/--no-enable-metrics", default=True, show_default=True,
              help="sglang's --enable-metrics: meta_info time stamps and /metrics (tracebench launches sglang with it).")
@click.option("--disable-overlap-schedule", is_flag=True, default=False,
              help="sglang's flag: plan each step after the previous one ends (default: overlap, planned while the "
                   "previous step runs, so a new request waits one extra step).")
@click.option("--disable-radix-cache", is_flag=True, default=False,
              help="sglang's flag: no prefix cache (every prompt is prefilled in full, cached_tokens is always 0). "
                   "Default: sglang's radix cache on the token ids received (or a text prompt's words), LRU eviction "
                   "when KV is full, emptied by POST /flush_cache.")
@click.option("--enable-cache-report", is_flag=True, default=False,
              help="sglang's flag: OpenAI answers (/v1/completions, /v1/chat/completions) report the prompt tokens "
                   "served from the prefix cache in usage.prompt_tokens_details.cached_tokens (only when > 0, as "
                   "sglang; without it they say nothing of the cache). tracebench replay --api completions|chat "
                   "launches sglang and the simulator with it. /generate's meta_info has cached_tokens either way.")
@click.option("--skip-tokenizer-init", is_flag=True, default=False,
              help="sglang's flag: answers carry no 'text' and text prompts are refused (tracebench launches real "
                   "sglang with it). Default: a word-level tokenizer (one token per word, output text ' w<id>').")
@click.option("--disaggregation-mode", type=click.Choice(DISAGGREGATION_MODES), default="null",
              show_default=True,
              help="sglang's PD disaggregation: a prefill-only or decode-only server (.DUCUMENT/pd-disaggregation.md). "
                   "Requests must carry bootstrap_host, bootstrap_port and bootstrap_room (tracebench replay --pd and "
                   "sglang-router's PD mode add them). A prefill server serves sglang's bootstrap server on "
                   "--disaggregation-bootstrap-port and answers (one token) when its KV reached the decode server; "
                   "a decode server takes a request into its batch only when its KV arrived.")
@click.option("--disaggregation-bootstrap-port", type=INT, default=DEFAULT_BOOTSTRAP_PORT, show_default=True,
              help="sglang's flag: the prefill server's bootstrap server port.")
@click.option("--disaggregation-transfer-backend",
              type=click.Choice(TRANSFER_BACKENDS), default="mooncake",
              show_default=True,
              help="sglang's flag, recorded in /server_info (mooncake_tcp shows as mooncake, as in sglang); the "
                   "simulated transfer is the same for all. A prefill server refuses fake, as sglang 0.5.17 does.")
@click.option("--kv-transfer-bandwidth", type=FINITE, default=DEFAULT_KV_BANDWIDTH_GIB_S, show_default=True,
              metavar="GIB_S",
              help="PD: the prefill server's KV link in GiB/s while it moves bytes. A request's KV (524,288 bytes per "
                   "prompt token for llama-2-7b: 32 layers x 32 KV heads x 128 x K,V x 2 bytes) holds the link for "
                   "bytes / bandwidth (divided by --speed), one transfer at a time, first come first served. The "
                   "default is measured: mooncake over TCP (mooncake_tcp) between two NVIDIA H200s of one host, "
                   "sglang 0.5.17, 2026-11-26, from tracebench's per-transfer stamps (prefill done -> KV at the "
                   "decode server) of the 99 back-to-back transfers of the real 1P1D runs in "
                   "reports/examples/h200x2-pd (1.536 GiB/s). Those are the runs the simulator is compared with there: "
                   "a calibration, not a held-out figure. The older one-figure link was 1.41 with no latency.")
@click.option("--kv-transfer-latency", type=FINITE, default=DEFAULT_KV_LATENCY_S, show_default=True,
              metavar="SECONDS",
              help="PD: a fixed time each transfer takes on top of its bytes, which does not hold the link (the "
                   "next transfer's bytes go meanwhile; in sglang the decode server's poll and the status message). "
                   "Divided by --speed. The default is measured on the same machine and date: what 25 lone transfers "
                   "(bench/gpu/pd.sh stage bw's 12 sequential 1 GiB transfers, and those of the 1P1D runs that found "
                   "the link idle) took beyond their bytes at 1.536 GiB/s, median (69 ms; the bw stage alone: 73).")
def sim_server(port: int, host: str, profile_name: str | None, gpu: str | None, speed: float, max_running_requests: int | None,
               max_total_tokens: int | None, context_length: int, chunked_prefill_size: int, startup_delay: float,
               seed: int, vocab_size: int, crash_on_bad_token: bool, enable_metrics: bool,
               disable_overlap_schedule: bool, disable_radix_cache: bool, enable_cache_report: bool,
               skip_tokenizer_init: bool, disaggregation_mode: str, disaggregation_bootstrap_port: int, disaggregation_transfer_backend: str,
               kv_transfer_bandwidth: float, kv_transfer_latency: float) -> None:
    """A simulated sglang 0.5.17 server (llama-2-7b-hf): sglang's HTTP API, timed like a continuous-batching GPU.

    \b
    POST /generate (input_ids or text, batch, stream); the OpenAI-compatible POST /v1/completions (prompt: text or
    token ids; output length from max_tokens, default 16: like sglang 0.5.17's CompletionRequest it has no
    max_completion_tokens field and ignores one) and POST /v1/chat/completions (messages, rendered by the word-level
    chat template; max_completion_tokens, else max_tokens, else 128), streamed or not, with usage (and
    stream_options include_usage / continuous_usage_stats); GET /health, /health_generate, /server_info,
    /get_server_info, /model_info, /v1/models, /v1/loads, /get_load, /metrics; POST /flush_cache,
    /set_internal_state.
    There is no EOS: every request gets exactly max_new_tokens output tokens (as with ignore_eos).
    Serves until SIGINT or SIGTERM. Exit 2: bad input, including a --port taken and a --host that is not an
    address of this machine (said before anything starts).
    """
    from tracebench.sim.server import serve

    args = resolve_sim_args(
        port, host, profile_name, gpu, speed, max_running_requests, max_total_tokens, context_length,
        chunked_prefill_size, startup_delay, seed, vocab_size, crash_on_bad_token, enable_metrics,
        disable_overlap_schedule, disable_radix_cache, enable_cache_report, skip_tokenizer_init, disaggregation_mode,
        disaggregation_bootstrap_port, disaggregation_transfer_backend, kv_transfer_bandwidth, kv_transfer_latency)
    check_can_listen(host, port)
    if disaggregation_mode == "prefill":  # its bootstrap server listens there too (it was a traceback)
        check_can_listen(host, disaggregation_bootstrap_port, "--disaggregation-bootstrap-port")
    serve(args)


def resolve_sim_args(port: int, host: str, profile_name: str | None, gpu: str | None, speed: float,
                     max_running_requests: int | None, max_total_tokens: int | None, context_length: int,
                     chunked_prefill_size: int, startup_delay: float, seed: int, vocab_size: int,
                     crash_on_bad_token: bool, enable_metrics: bool, disable_overlap_schedule: bool,
                     disable_radix_cache: bool, enable_cache_report: bool, skip_tokenizer_init: bool,
                     disaggregation_mode: str, disaggregation_bootstrap_port: int,
                     disaggregation_transfer_backend: str, kv_transfer_bandwidth: float,
                     kv_transfer_latency: float) -> SimArgs:
    """The sim-server's flags checked and resolved (ConfigError for bad ones): what the process serves with, and
    what an in-process server (sim/inprocess.py) is built from."""
    from tracebench.sim.args import SimArgs
    from tracebench.sim.catalog import resolve_profile

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1..65535, got {port}")
    if not SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]:  # (FINITE already refused nan and inf)
        raise ConfigError(f"--speed must be between {SPEED_RANGE[0]:g} and {SPEED_RANGE[1]:g}, got {speed:g}")
    for flag, value in (("--max-running-requests", max_running_requests), ("--max-total-tokens", max_total_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    for flag, value in (("--context-length", context_length), ("--chunked-prefill-size", chunked_prefill_size),
                        ("--vocab-size", vocab_size)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if startup_delay < 0:
        raise ConfigError(f"--startup-delay must be >= 0, got {startup_delay}")
    if not 0 < disaggregation_bootstrap_port < 65536:
        raise ConfigError(f"--disaggregation-bootstrap-port must be in 1..65535, got {disaggregation_bootstrap_port}")
    if not kv_transfer_bandwidth > 0:
        raise ConfigError(f"--kv-transfer-bandwidth must be > 0, got {kv_transfer_bandwidth}")
    if kv_transfer_latency < 0:
        raise ConfigError(f"--kv-transfer-latency must be >= 0, got {kv_transfer_latency}")
    if disaggregation_mode == "prefill" and disaggregation_transfer_backend == "fake":
        # pd_disaggregation_hook.py L100-103
        raise ConfigError("Prefill server does not support 'fake' as the transfer backend")
    if disaggregation_mode == "prefill" and disaggregation_bootstrap_port == port:
        raise ConfigError(f"--disaggregation-bootstrap-port {port} is the server's own --port: give another")
    profile = resolve_profile(profile_name, gpu)
    return SimArgs(host=host, port=port, profile=profile, speed=speed, max_running_requests=max_running_requests,
                    max_total_tokens=max_total_tokens, context_length=context_length,
                   chunked_prefill_size=chunked_prefill_size, startup_delay=startup_delay, seed=seed,
                   vocab_size=vocab_size, crash_on_bad_token=crash_on_bad_token, enable_metrics=enable_metrics,
                   disable_overlap_schedule=disable_overlap_schedule, skip_tokenizer_init=skip_tokenizer_init,
                   disable_radix_cache=disable_radix_cache, enable_cache_report=enable_cache_report,
                   disaggregation_mode=disaggregation_mode,
                   disaggregation_transfer_backend=disaggregation_transfer_backend,
                   disaggregation_bootstrap_port=disaggregation_bootstrap_port,
                   kv_transfer_bandwidth=kv_transfer_bandwidth, kv_transfer_latency=kv_transfer_latency)
