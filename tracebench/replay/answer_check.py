"""Is a finished answer what the trace asked for? A request the server finished is `ok` only when it generated
`output_len` tokens and counted `input_len` prompt tokens; anything else is `mismatch`, with the record's `mismatch`
field saying what differs and why, where that is known. The check runs for every API (`/generate`, `/v1/completions`,
`/v1/chat/completions`; streamed or not): each reports completion_tokens and prompt_tokens (meta_info or usage).

The known cause of a short answer is sglang's context rule (0.5.17, `python/sglang/srt/managers/scheduler.py`
L2132-2141 `init_req_max_new_tokens`, `tp_worker.py` L509-513 `get_worker_info`): every request's max_new_tokens is
clipped to

    max(0, min(max_new_tokens, max_req_len - input_len - 1,
               max_total_num_tokens * dcp_size - ceil_page(input_len) - page_size - 1))

with max_req_len = min(context_len - 1, KV pool - 1). So with a 4096 context a request gets its whole output only when
input_len + output_len <= 4094, although sglang accepts (HTTP 200) up to 4096. The limits come from the server's
`/server_info` at start: `max_req_input_len` (= max_req_len - 5, tp_worker.py L509-518, reported by scheduler.py
L1613-1618), `max_total_num_tokens`, `page_size`, `dcp_size` (.DUCUMENT/failure-modes.md).

A mismatch's text is "FIELD got != TRACE_FIELD wanted: REASON", two such parts joined by "; " when both counts
differ; REASON holds only numbers that are the same for the whole run and no "; ", so mismatches can be counted by
reason (`mismatch_reason`; the report does the same with polars).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tracebench.errors import ServerStartError
from tracebench.replay.records import RequestRecord

_SOURCE = "sglang 0.5.17 scheduler.py L2132-2141"
_CHAT_PROMPT = ("--api chat sends the ids as words w<id> in one user message, exact only with the word-level "
                "tokenizer and its chat template (one word one token, no token added): this server's tokenizer or "
                "chat template counts them otherwise (.DUCUMENT/openai-api.md)")


@dataclass(frozen=True)
class ContextLimits:
    """The limits sglang's scheduler clips max_new_tokens with, as one server reported them (/server_info)."""

    max_req_len: int  # min(context_len - 1, KV pool - 1) = /server_info max_req_input_len + 5
    max_total_num_tokens: int  # the KV pool, tokens
    page_size: int
    dcp_size: int

    @classmethod
    def from_server_info(cls, where: str, info: dict[str, Any]) -> ContextLimits:
        """From a `/server_info` body (real sglang 0.5.17 and the sim-server both report these fields)."""
        values = {}
        for key in ("max_req_input_len", "max_total_num_tokens", "page_size", "dcp_size"):
            value = info.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ServerStartError(f"{where}: /server_info has no positive integer '{key}' ({value!r}): the replay "
                                       "needs it to check answers against sglang's context rule "
                                       "(.DUCUMENT/failure-modes.md)")
            values[key] = value
        return cls(values["max_req_input_len"] + 5, values["max_total_num_tokens"], values["page_size"],
                   values["dcp_size"])

    @property
    def kv_bound(self) -> bool:
        """max_req_len comes from the KV pool, not from the context length (a pool smaller than the context)."""
        return self.max_req_len >= self.max_total_num_tokens * self.dcp_size - 1

    def _kv_room(self, input_len: int) -> int:
        paged_input = -(-input_len // self.page_size) * self.page_size
        return self.max_total_num_tokens * self.dcp_size - paged_input - self.page_size - 1

    def max_new_tokens(self, input_len: int, asked: int) -> int:
        """What sglang lets a request of `input_len` prompt tokens generate when it asks for `asked`."""
        return max(0, min(asked, self.max_req_len - input_len - 1, self._kv_room(input_len)))

    def clip_reason(self, input_len: int) -> str:
        """Which of the rule's bounds clipped a request of `input_len` tokens, in words that do not depend on it."""
        if self._kv_room(input_len) < self.max_req_len - input_len - 1:
            return (f"sglang clips max_new_tokens to its KV pool, max_total_num_tokens - input_len - page_size - 1 "
                    f"(max_total_num_tokens {self.max_total_num_tokens}, {_SOURCE})")
        if self.kv_bound:
            return (f"sglang clips max_new_tokens to max_req_len - input_len - 1 (max_req_len {self.max_req_len}: its "
                    f"KV pool - 1, {_SOURCE})")
        context = self.max_req_len + 1
        return (f"sglang clips max_new_tokens to context_len - 1 - input_len - 1 (context_len {context}: the whole "
                f"output only when input_len + output_len <= {context - 2}, {_SOURCE})")


def check_answer(rec: RequestRecord, limits: ContextLimits | None, api: str) -> str | None:
    """None when the finished answer of `rec` (completion_tokens, prompt_tokens filled in) matches the trace, else
    what differs and why. `limits`: the server's (None when not known: several servers with different limits behind
    sglang-router); `api`: the run's --api."""
    problems = []
    got, wanted = rec.completion_tokens, rec.output_len
    if got != wanted:
        what = f"completion_tokens {got} != output_len {wanted}"
        if got is not None and got > wanted:
            why = "more tokens than max_new_tokens asked for: reason unknown"
        elif limits is None:
            why = "reason unknown (the server's context limits are not known: servers behind sglang-router that differ)"
        elif limits.max_new_tokens(rec.input_len, wanted) == got:
            why = limits.clip_reason(rec.input_len)
        elif limits.max_new_tokens(rec.input_len, wanted) == wanted:
            why = "reason unknown (sglang's context rule leaves this request its whole output)"
        else:
            why = "reason unknown (not the count sglang's context rule gives either)"
        problems.append(f"{what}: {why}")
    if rec.prompt_tokens != rec.input_len:
        what = f"prompt_tokens {rec.prompt_tokens} != input_len {rec.input_len}"
        why = _CHAT_PROMPT if api == "chat" else "reason unknown (the trace's ids were sent as they are)"
        problems.append(f"{what}: {why}")
    return "; ".join(problems) if problems else None


_COUNTS = re.compile(r"^(\w+) [^\s:]+ != (\w+) [^\s:]+")


def mismatch_reason(mismatch: str) -> str:
    """A mismatch's text without the request's own numbers ("completion_tokens != output_len: REASON"), to count
    mismatches by reason."""
    return "; ".join(_COUNTS.sub(r"\1 != \2", part) for part in mismatch.split("; "))
