"""What the sim-server accepts: a /generate body checked in sglang 0.5.17's order (its tokenizer manager's checks, then
the scheduler's input-length abort). Pure: no HTTP, no model, no clock; the faces turn its errors into answers."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tracebench.sim.args import SimArgs
from tracebench.sim.model import sglang_max_new_tokens

DEFAULT_MAX_NEW_TOKENS = 128   # sglang's default when sampling_params has no max_new_tokens


class BadRequest(Exception):
    """A request sglang's tokenizer manager refuses: 400 `{"error": {"message": ...}}`, or in a stream an SSE error
    event (status 200)."""


class SchedulerAbort(Exception):
    """A request sglang's scheduler refuses after accepting it (input >= max_req_input_len): 400 non-stream, or in a
    stream one chunk whose finish_reason is an abort (status 200)."""


class FatalInput(Exception):
    """An input id out of the vocabulary with --crash-on-bad-token: real sglang dies of a device-side assert, so the
    server exits at once (`engine.crash`), answering nothing."""


class Parsed(NamedTuple):
    """A valid /generate body: one prompt or a batch, each item (input_len, max_new_tokens, tokens), and their rids.
    max_new_tokens is what the scheduler lets the request generate (sglang's clip), not always what it asked.
    tokens are what the prefix cache matches: the input ids, or a text prompt's words."""

    single: bool
    items: list[tuple[int, int, Sequence]]
    rids: list[str]


# tracebench's client says when it sent a request (its wall clock, seconds), so the simulator can take the request in
# when real sglang would: the profile's request_hop_s after it was sent (sglang's HTTP server and tokenizer manager
# take ~2 ms; this host's loopback ~0.4), not when the loopback brought it. The client's copy: replay/client.py.
SENT_HEADER = "X-Tracebench-Sent"


def receipt_time(headers: Mapping[str, str], t_arrived: float, wall_arrived: float, hop_s: float, t_last: float
                 ) -> float:
    """The moment (loop time) the server takes in a request that arrived at `t_arrived` (loop time; `wall_arrived`:
    the same moment on the wall clock, which the header's is compared with): `hop_s` after the client sent
    it (SENT_HEADER), or on arrival when that has passed (a slow host: the hop the client saw) or the client did not
    say (another client). At most `hop_s` after arrival: a client whose clock runs ahead cannot hold a request
    longer. After `t_last`, the receipt of the request that arrived before it: sglang takes requests in one at a time
    as they reach it (one sent earlier over a slower connection comes in after), so two receipts never tie (at
    least the next float: the faces' waits for them, engine.until_receipt, end in this order). BadRequest for a
    header that is not a finite number."""
    after_last = math.nextafter(t_last, math.inf)
    sent = headers.get(SENT_HEADER)
    if sent is None:
        return max(t_arrived, after_last)
    try:
        sent_wall = float(sent)
    except ValueError:
        sent_wall = math.nan
    if not math.isfinite(sent_wall):   # (float() takes 'nan' and 'inf': one held a request a hop, one not at all)
        raise BadRequest(f"header {SENT_HEADER}: {sent!r} is not a number (the sender's wall clock, seconds)")
    return max(t_arrived + min(hop_s, max(0.0, sent_wall + hop_s - wall_arrived)), after_last)


def parse_generate(obj: dict, stream: bool, args: SimArgs, rids_in_flight: set[str]) -> Parsed:
    """Validate a /generate body in sglang's order; raises BadRequest, SchedulerAbort or FatalInput."""
    text = obj.get("text")
    input_ids = obj.get("input_ids")
    id_lists: list[list[int]] | None = None
    if text is not None:
        single = isinstance(text, str)
        texts = [text] if single else text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a list of strings.")
        if args.skip_tokenizer_init:
            raise BadRequest("The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
                             "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False.")
        token_lists: list[Sequence] = [t.split() for t in texts]  # the word-level tokenizer: one token per word
        lengths = [len(words) for words in token_lists]
    elif input_ids is not None:
        if not isinstance(input_ids, list):
            raise BadRequest("input_ids must be a list of token ids or a list of such lists.")
        if len(input_ids) == 0:
            raise BadRequest("input_ids cannot be empty.")
        single = isinstance(input_ids[0], int)
        id_lists = [input_ids] if single else input_ids
        for ids in id_lists:
            # every element exactly an int (not a bool, a float or a list): one pass in C, not a generator per id
            if not isinstance(ids, list) or (ids and set(map(type, ids)) != {int}):
                raise BadRequest("input_ids must be a list of token ids or a list of such lists.")
        lengths = [len(ids) for ids in id_lists]
        token_lists = id_lists
    else:
        raise BadRequest("Either text, input_ids or input_embeds should be provided.")
    n = len(lengths)
    if n == 0:
        raise BadRequest("input_ids cannot be empty.")
    if stream and not single:
        raise BadRequest("tracebench sim-server: streaming a batch is not supported; send one request per stream.")
    rid = obj.get("rid")
    if rid is None:
        rids = [uuid.uuid4().hex for _ in range(n)]
    elif isinstance(rid, str):
        rids = [rid] if n == 1 else [f"{rid}_{i}" for i in range(n)]
    elif isinstance(rid, list) and all(isinstance(r, str) for r in rid):
        if len(rid) != n:
            raise BadRequest("The specified rids length mismatch with the batch_size for batch processing.")
        rids = rid
    else:
        raise BadRequest("The rid should be a string or a list of strings.")
    seen: set[str] = set()
    for r in rids:
        if r in seen or r in rids_in_flight:
            raise BadRequest(f"Duplicate request ID detected: {r}")
        seen.add(r)
    params = obj.get("sampling_params") or {}
    if isinstance(params, dict):
        param_list = [params] * n
    elif isinstance(params, list) and len(params) == n and all(isinstance(p, dict) for p in params):
        param_list = params
    else:
        raise BadRequest("sampling_params must be an object, or a list of objects as long as the batch.")
    items: list[tuple[int, int, Sequence]] = []
    for k in range(n):
        max_new = param_list[k].get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        items.append((lengths[k], check_item(lengths[k], max_new, None if id_lists is None else id_lists[k], args),
                      token_lists[k]))
    for input_len, _, _ in items:
        check_scheduler(input_len, args)
    items = [(n, clip_max_new(n, m, args), tokens) for n, m, tokens in items]
    return Parsed(single, items, rids)


def check_item(input_len: int, max_new: object, ids: list[int] | None, args: SimArgs) -> int:
    """One prompt's checks in sglang's tokenizer manager's order; returns its max_new_tokens (as asked; None or
    absent: sglang's default). `ids`: its input ids, checked against the vocabulary (None: a text prompt, or ids the
    caller made within the vocabulary). Raises BadRequest or FatalInput."""
    if input_len == 0:
        raise BadRequest("input_ids cannot be empty.")
    if max_new is None:
        max_new = DEFAULT_MAX_NEW_TOKENS
    if type(max_new) is not int:
        raise BadRequest(f"max_new_tokens must be an integer, got {max_new!r}.")
    if input_len >= args.context_length:
        raise BadRequest(f"The input ({input_len} tokens) is longer than the model's context length "
                         f"({args.context_length} tokens).")
    if input_len + max_new > args.context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of {args.context_length} "
            f"tokens. You requested a total of {input_len + max_new} tokens: {input_len} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the number of tokens in "
            f"the input messages or the completion to fit within the limit.")
    if max_new < 0:
        raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
    if ids is not None and (max(ids) >= args.vocab_size or min(ids) < 0):
        if args.crash_on_bad_token:
            raise FatalInput(f"input id out of vocabulary ({args.vocab_size}): crashing like sglang "
                             "(--crash-on-bad-token)")
        raise BadRequest(f"The input_ids {ids} contains values greater than the vocab size "
                         f"({args.vocab_size}).")
    need = input_len + max_new
    max_total_num_tokens = args.effective_max_total_num_tokens
    if need > max_total_num_tokens:
        raise BadRequest(f"The request needs {need} KV cache tokens (input + max_new_tokens) but the "
                         f"server's max_total_num_tokens is {max_total_num_tokens}.")
    return max_new


def check_scheduler(input_len: int, args: SimArgs) -> None:
    """The scheduler's own refusal of an accepted prompt (SchedulerAbort)."""
    if input_len >= args.max_req_input_len:
        raise SchedulerAbort(f"Input length ({input_len} tokens) exceeds the maximum allowed length "
                             f"({args.max_req_input_len} tokens). Use a shorter input or enable "
                             "--allow-auto-truncate.")


def clip_max_new(input_len: int, max_new: int, args: SimArgs) -> int:
    """Accepted as asked; generated as sglang's scheduler clips it on entry (scheduler.py L2132-2141): with context
    4096 the whole output only up to input + max_new_tokens = 4094 (.DUCUMENT/failure-modes.md)."""
    return sglang_max_new_tokens(max_new, input_len, args.context_length, args.effective_max_total_num_tokens)
