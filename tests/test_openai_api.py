"""The OpenAI-compatible API: the sim-server's /v1/completions and /v1/chat/completions against sglang 0.5.17 (the
captured /v1/completions answer, and the shapes its serving_completions.py / serving_chat.py write:
.DUCUMENT/openai-api.md), and how replay's `--api` objects read them."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np

from conftest import SGLANG_CAPTURES
from tracebench.replay.client import ChatApi, CompletionsApi

CAPTURED = json.loads(json.loads((SGLANG_CAPTURES / "api_capture.json").read_text())["v1_completions"]["body"])


def post(url: str, body: dict | bytes, content_type: str = "application/json") -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def events(raw: bytes) -> list[dict]:
    parts = raw.split(b"\n\n")
    assert parts[-2:] == [b"data: [DONE]", b""], raw[-200:]
    assert all(p.startswith(b"data: ") for p in parts[:-2])
    return [json.loads(p[6:]) for p in parts[:-2]]


def test_completions_answer_has_the_captured_shape(sim_server) -> None:
    sim = sim_server("--speed", "50")
    status, raw = post(f"{sim.url}/v1/completions", {"model": "x", "prompt": [1001, 1002, 1003], "max_tokens": 4})
    assert status == 200
    answer = json.loads(raw)
    assert list(answer) == list(CAPTURED)
    assert list(answer["choices"][0]) == list(CAPTURED["choices"][0])
    assert answer["usage"] == CAPTURED["usage"]  # 3 prompt ids, 4 tokens: the capture's counts
    assert answer["model"] == "x" and answer["object"] == "text_completion" and answer["metadata"] == CAPTURED["metadata"]
    assert len(answer["choices"][0]["text"].split()) == 4
    # text prompts count one token per word (the word-level tokenizer)
    _, raw = post(f"{sim.url}/v1/completions", {"prompt": "w5 w6 w7 w8 w9", "max_tokens": 2})
    assert json.loads(raw)["usage"]["prompt_tokens"] == 5
    # replay's reading of it
    ok = CompletionsApi().final_answer("u", raw)
    assert ok.status == "ok" and ok.meta == {"prompt_tokens": 5, "completion_tokens": 2}
    assert CompletionsApi().final_answer("u", json.dumps(CAPTURED).encode()).meta == {"prompt_tokens": 3, "completion_tokens": 4}


def test_completions_stream_chunks(sim_server) -> None:
    sim = sim_server("--speed", "2")  # slow enough for one chunk per token
    body = {"prompt": list(range(1000, 1020)), "max_tokens": 5, "stream": True}
    chunks = events(post(f"{sim.url}/v1/completions", body)[1])
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in chunks)  # no usage unless asked
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert len("".join(c["choices"][0]["text"] for c in chunks).split()) == 5  # deltas, not cumulative
    chunks = events(post(f"{sim.url}/v1/completions", {**body, "stream_options": {"include_usage": True,
                                                                                   "continuous_usage_stats": True}})[1])
    *tokens, usage = chunks
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 20, "total_tokens": 25,
                                                         "completion_tokens": 5, "reasoning_tokens": 0}
    counts = [c["usage"]["completion_tokens"] for c in tokens]
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] >= 1
    api = CompletionsApi()
    assert api.tokens_so_far("u", json.dumps(tokens[0]).encode()) == counts[0]
    assert api.final_answer("u", json.dumps(usage).encode()).meta == {"prompt_tokens": 20, "completion_tokens": 5}


def test_chat_stream_and_answer(sim_server) -> None:
    sim = sim_server("--speed", "2")
    ids = np.arange(1000, 1012)
    body = json.loads(ChatApi().body(ids, 4, True))
    assert body["messages"] == [{"role": "user", "content": " ".join(f"w{i}" for i in ids)}]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chunks = events(post(f"{sim.url}/v1/chat/completions", body)[1])
    role, *content, finish, usage = chunks
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "usage" not in role and "usage" not in finish
    assert all(set(c["choices"][0]["delta"]) == {"reasoning_content", "content"} for c in content)
    assert finish["choices"][0] == {"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
                                    "finish_reason": "length", "matched_stop": None}
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"] is None  # chat's dump keeps nulls
    assert usage["usage"]["prompt_tokens"] == 12 and usage["usage"]["completion_tokens"] == 4  # exact: 12 words
    api = ChatApi()
    assert api.tokens_so_far("u", json.dumps(role).encode()) == 0
    assert api.tokens_so_far("u", json.dumps(content[0]).encode()) >= 1
    status, raw = post(f"{sim.url}/v1/chat/completions", json.loads(ChatApi().body(ids, 4, False)))
    answer = json.loads(raw)
    assert status == 200 and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant" and answer["usage"]["prompt_tokens"] == 12
    assert api.final_answer("u", raw).meta == {"prompt_tokens": 12, "completion_tokens": 4}


def test_openai_refusals(sim_server) -> None:
    sim = sim_server()
    for path, body, message in (
        ("/v1/completions", {"prompt": ""}, "Prompt cannot be empty"),
        ("/v1/chat/completions", {"messages": []}, "Messages cannot be empty."),
    ):
        status, raw = post(f"{sim.url}{path}", body)
        assert status == 400 and json.loads(raw) == {"object": "error", "message": message, "type": "BadRequestError",
                                                     "param": None, "code": 400}
    # a stream refused before it starts is a 400 JSON answer, not an SSE event (sglang pulls the first chunk first)
    status, raw = post(f"{sim.url}/v1/completions", {"prompt": list(range(1000, 5100)), "stream": True})
    assert status == 400 and "longer than the model's context length" in json.loads(raw)["message"]
    answer = CompletionsApi().final_answer("u", raw)
    assert answer.status == "error" and "context length" in answer.error
    status, raw = post(f"{sim.url}/v1/completions", b"{not json")
    assert status == 400 and json.loads(raw)["type"] == "Bad Request" and "POST /v1/completions" in json.loads(raw)["message"]
    status, raw = post(f"{sim.url}/v1/completions", {"prompt": [1001]}, content_type="text/plain")
    assert status == 400 and "Unsupported Media Type" in json.loads(raw)["message"]
    # the scheduler's abort inside a stream: an error event, the usage chunk when asked, [DONE]
    status, raw = post(f"{sim.url}/v1/completions", {"prompt": list(range(1000, 5092)), "max_tokens": 1, "stream": True,
                                                     "stream_options": {"include_usage": True}})
    error, usage = events(raw)
    assert status == 200 and "exceeds the maximum allowed length" in error["error"]["message"] and usage["choices"] == []


def test_openai_answers_end_after_the_profiles_answer_end(sim_server, tmp_path) -> None:
    # the answer's end (docs/sim-server.md "Answer's end") on the OpenAI routes, whole and streamed: a profile whose
    # response hop is 0.2 s holds every answer's end ~0.2 s after the model finished it (a 2-token answer's model time
    # is ~20 ms), once: not skipped (it would end at once), not applied twice (0.4 s)
    from tracebench.profiles import PROFILES_DIR, load_profile

    raw = json.loads((PROFILES_DIR / "llama-2-7b-h200-triton.json").read_text())
    raw["name"], raw["params"]["response_hop_s"] = "slow-answer-end", 0.2
    path = tmp_path / "slow-answer-end.json"
    path.write_text(json.dumps(raw))
    hold = load_profile(str(path)).answer_end_s
    sim = sim_server("--profile", str(path))
    for route, body in (("/v1/completions", {"prompt": [1001, 1002, 1003], "max_tokens": 2}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1 w2"}],
                                                  "max_tokens": 2})):
        for stream in (False, True):
            start = time.monotonic()
            status, answer = post(f"{sim.url}{route}", {**body, "stream": stream})
            took = time.monotonic() - start
            assert status == 200, answer
            assert hold <= took < 2 * hold, (route, stream, took)
