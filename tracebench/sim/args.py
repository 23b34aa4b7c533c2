"""What one sim-server process is configured as: its flags (`SimArgs`, resolved from the CLI) and the model it claims
to serve. Read by every part of the server; imports nothing of it."""

from __future__ import annotations

from dataclasses import dataclass

from tracebench.profiles import Profile
from tracebench.sim.model import resolve_max_running_requests

MODEL_NAME = "llama-2-7b-hf"
# PD disaggregation (pd.py): sglang's choices and default port (server_args.py L230-237, L2983-3000), and the
# simulated link (reports/examples/h200x2-pd/sim-vs-real.md "The link model"): mooncake_tcp between two NVIDIA H200s of
# one host (sglang 0.5.17, mooncake-transfer-engine cu13 0.3.14), 2026-11-26, from tracebench's per-transfer stamps
# (the prefill server's prefill_finished_time -> the decode server's KV arrival, forward_entry_time - queue_time):
# - bandwidth 1.54 GiB/s: the 99 back-to-back transfers of the PD runs pd-shared and pd-mooncake (each began when
#   the previous one arrived): their bytes over the time between arrivals, 1.536 (1.526 and 1.551 per run). These
#   are the stamps of the very runs sim-vs-real.md compares with, so the PD rows there are a calibration, not a
#   held-out check.
# - latency 0.07 s: what a lone transfer (the link idle when its prefill ended) took beyond its bytes at 1.536, median
#   of 25 (the bw stage's 12 sequential 1 GiB transfers and 13 of the PD runs): 69 ms (the bw run alone: 73).
# The bw stage's one figure, sglang's kv_transfer_total_mb / kv_transfer_latency_ms = 1.407 GiB/s, is the lone rate
# (bytes and latency together), the default before the two-figure link.
DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_KV_BANDWIDTH_GIB_S = 1.54
DEFAULT_KV_LATENCY_S = 0.07
SGLANG_VERSION = "0.5.17"


@dataclass(frozen=True)
class SimArgs:
    """The sim-server's configuration (the CLI flags, resolved)."""

    host: str
    port: int
    profile: Profile
    speed: float
    max_running_requests: int | None     # None: sglang's default for the KV capacity
    max_total_tokens: int | None         # None: the profile's GPU capacity
    context_length: int
    chunked_prefill_size: int
    startup_delay: float
    seed: int
    vocab_size: int
    crash_on_bad_token: bool
    enable_metrics: bool
    disable_overlap_schedule: bool
    skip_tokenizer_init: bool
    disable_radix_cache: bool = False
    # sglang's --enable-cache-report: OpenAI answers carry usage.prompt_tokens_details.cached_tokens (openai_routes.py)
    enable_cache_report: bool = False
    # PD disaggregation (pd.py): sglang's --disaggregation-mode/-transfer-backend/-bootstrap-port, and the simulated
    # link's bandwidth (GiB/s) and per-transfer latency (s, overlapping the next transfer)
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    kv_transfer_bandwidth: float = DEFAULT_KV_BANDWIDTH_GIB_S
    kv_transfer_latency: float = DEFAULT_KV_LATENCY_S

    @property
    def effective_max_running_requests(self) -> int:
        return resolve_max_running_requests(self.max_running_requests, self.effective_max_total_num_tokens,
                                            self.context_length)

    @property
    def effective_max_total_num_tokens(self) -> int:
        return self.max_total_tokens if self.max_total_tokens is not None else self.profile.max_total_num_tokens

    @property
    def max_req_input_len(self) -> int:
        """sglang: (context_len - 1) - 5; inputs this long pass the tokenizer's check but the scheduler aborts them."""
        return self.context_length - 6
