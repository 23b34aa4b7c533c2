"""What one sim-server process is configured as: its flags (`SimArgs`, resolved from the CLI) and the model it claims
to serve. Read by every part of the server; imports nothing of it."""

from __future__ import annotations

from dataclasses import dataclass

from tracebench.sim.model import Profile, resolve_max_running_requests

MODEL_NAME = "llama-2-7b-hf"
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
