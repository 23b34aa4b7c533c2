"""Settle sglang's context rule on one running server: how many tokens does it generate near the context limit?

sglang 0.5.17 answers 200 while input_len + max_new_tokens <= context_len, but its scheduler clips max_new_tokens to
context_len - 1 - input_len - 1 (python/sglang/srt/managers/scheduler.py L2132-2141, tp_worker.py L509-513), so the
whole answer comes only when input_len + max_new_tokens <= context_len - 2 (4094 for llama-2's 4096). This probe asks,
one request at a time with plain HTTP (`POST /generate`, `input_ids`, non-streamed unless said):
- input 4089 (the longest prompt the scheduler accepts) with max_new_tokens 1..7, and 8 (over the context: 400);
- input 4000 with max_new_tokens 93..96, and 97 (over the context: 400);
- input 4089 with 7, streamed (the stream's last meta_info counts the same).
For each it writes what was asked, the HTTP status, what was generated (completion_tokens, finish_reason) and what
the rule predicts, status and length separately; the verdict says whether every answer agrees with the rule.

    python3 bench/gpu/clip_probe.py --url http://127.0.0.1:30000 --out clip_probe.json

The server must accept input ids (sglang with or without --skip-tokenizer-init, or `tracebench sim-server`); every id
is in [1000, 32000) (inside llama-2's vocabulary: an id outside it kills a real server). Standard library only; about
15 requests with ~4k-token prompts: a few seconds on one GPU. Exit status 1 when an answer disagrees with the rule.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request
from typing import Any

VOCAB_LOW, VOCAB_HIGH = 1000, 32000
SERIES: tuple[tuple[int, tuple[int, ...], bool], ...] = (
    (4089, (1, 2, 3, 4, 5, 6, 7, 8), False),
    (4000, (93, 94, 95, 96, 97), False),
    (4089, (7,), True),
)


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def post_generate(url: str, input_ids: list[int], max_new_tokens: int, stream: bool) -> tuple[int, dict[str, Any]]:
    """(HTTP status, the final object: the answer, the last stream event, or the error body)."""
    body = json.dumps({"input_ids": input_ids, "stream": stream,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}})
    request = urllib.request.Request(f"{url}/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
    if not stream:
        return status, json.loads(raw)
    events = [line[len(b"data: "):] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    last = [e for e in events if e != b"[DONE]"][-1]
    return status, json.loads(last)


def expected(input_len: int, asked: int, context_len: int) -> tuple[int, int | None]:
    """The rule: (HTTP status, tokens generated) for a request of `input_len` asking `asked`."""
    if input_len + asked > context_len:
        return 400, None  # tokenizer_manager.py L1164-1189: over the context
    return 200, min(asked, context_len - 1 - input_len - 1)  # scheduler.py L2132-2141 (the KV term never binds here)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--out", default=None, help="write the JSON here (default: only print it)")
    opts = parser.parse_args()
    url = opts.url.rstrip("/")
    t0 = time.perf_counter()
    info = get_json(f"{url}/server_info")
    # /server_info context_length is the launch flag (null by default). The scheduler's max_req_input_len is
    # max_req_len - 5 with max_req_len = min(context_len - 1, KV pool - 1) (tp_worker.py L509-518): context_len =
    # max_req_input_len + 6 whenever the pool is larger than the context (107,675 tokens on an H100). /v1/models'
    # max_model_len says the context too; it is recorded beside (not needed: its answer under --skip-tokenizer-init
    # was never captured).
    context_len = info["max_req_input_len"] + 6
    if info["max_total_num_tokens"] <= context_len:
        raise SystemExit(f"the KV pool ({info['max_total_num_tokens']} tokens) is not larger than the context: the "
                         "probe's rule assumes it is")
    try:
        max_model_len: Any = get_json(f"{url}/v1/models")["data"][0]["max_model_len"]
    except (urllib.error.URLError, KeyError, IndexError, ValueError) as err:
        max_model_len = f"not read: {type(err).__name__}: {err}"
    doc: dict[str, Any] = {
        "url": url,
        "server": {k: info.get(k) for k in ("version", "context_length", "max_req_input_len", "max_total_num_tokens",
                                            "page_size", "dcp_size", "skip_tokenizer_init")},
        "context_len": context_len,
        "max_model_len": max_model_len,
        "simulated": isinstance(info.get("tracebench_sim"), dict),
        "requests": [],
    }
    rng = random.Random(19)
    agree = 0
    for input_len, asks, stream in SERIES:
        for asked in asks:
            ids = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(input_len)]
            status, obj = post_generate(url, ids, asked, stream)
            meta = obj.get("meta_info") if isinstance(obj, dict) else None
            error = obj.get("error") if isinstance(obj, dict) else None
            got = meta.get("completion_tokens") if isinstance(meta, dict) else None
            want_status, want_tokens = expected(input_len, asked, context_len)
            row = {
                "input_len": input_len, "asked": asked, "stream": stream, "status": status,
                "completion_tokens": got, "prompt_tokens": meta.get("prompt_tokens") if isinstance(meta, dict) else None,
                "finish_reason": meta.get("finish_reason") if isinstance(meta, dict) else None,
                "error": (error.get("message") if isinstance(error, dict) else error) if error else None,
                "rule_status": want_status, "rule_completion_tokens": want_tokens,
                "old_belief_completion_tokens": asked if input_len + asked <= context_len else None,  # n + m <= 4096
            }
            row["agrees"] = status == want_status and got == want_tokens
            agree += row["agrees"]
            doc["requests"].append(row)
            print(f"input {input_len:5d} asked {asked:3d}{' stream' if stream else '       '}  HTTP {status}  "
                  f"got {got!s:>4}  rule {want_status} {want_tokens!s:>4}  {'ok' if row['agrees'] else 'DIFFERS'}",
                  flush=True)
    total = len(doc["requests"])
    doc["verdict"] = (f"{agree} of {total} answers agree with the rule: 200 up to input + max_new_tokens <= "
                      f"{context_len}, tokens generated min(max_new_tokens, {context_len} - 1 - input - 1)")
    doc["seconds"] = round(time.perf_counter() - t0, 2)
    text = json.dumps(doc, indent=1)
    if opts.out:
        with open(opts.out, "w") as fh:
            fh.write(text + "\n")
    print(doc["verdict"], f"({doc['seconds']} s)")
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
