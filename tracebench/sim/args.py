"""What one sim-server process is configured as: its flags (`SimArgs`, resolved from the CLI) and the model it claims
to serve. Read by every part of the server; imports nothing of it."""

from __future__ import annotations

from dataclasses import dataclass

from tracebench.sim.model import Profile, resolve_max_running_requests

MODEL_NAME = "llama-2-7b-hf"
# PD disaggregation (pd.py): sglang's choices and default port (server_args.py L230-237, L2983-3000), and the
# simulated link's bandwidth: 1.41 GiB/s, measured (bench/gpu/pd.sh stage bw, 2026-11-26) for mooncake_tcp between two
# NVIDIA H200s of one host (sglang 0.5.17, mooncake-transfer-engine cu13 0.3.14): 12 sequential 2,048-token transfers
# (1 GiB each), the prefill server's sglang:kv_transfer_total_mb / kv_transfer_latency_ms = 1.407 GiB/s; tracebench's
# stamps (prefill done -> KV at the decode server) give a median 1.38 (reports/examples/h200x2-pd/README.md).
DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_KV_BANDWIDTH_GIB_S = 1.41
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
    # link's bandwidth (GiB/s)
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT
    kv_transfer_bandwidth: float = DEFAULT_KV_BANDWIDTH_GIB_S

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
