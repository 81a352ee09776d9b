"""llama-server's full context (docs/spec.md §13) against the real server: two slots share one
256-token KV cache (`--parallel 2 --kv-unified`), and each request fits the slot's window
alone, so the filter lets it go with a cap that fits; together they fill the cache, and
llama-server ends every answer under way with "Context size has been exceeded." (500 before
any output; an error event in a stream that started). Through Envoy + incontext each client
gets the signal its agents classify as a full window (docs/agents.md):

* a started OpenAI chat stream ends with `finish_reason` `length` and `[DONE]` (OpenCode and
  Qwen Code: an answer the window ended); a started Responses stream with `response.failed`
  `context_length_exceeded` (Codex: "ran out of room"); a started Anthropic stream with
  `stop_reason` `model_context_window_exceeded` after its block's `content_block_stop`
  (Claude Code: the window ended the answer; it does not raise its cap and retry);
* before any output, the OpenAI window error `context_length_exceeded` with the filter's P, B
  and C (Codex, OpenCode, Qwen Code; the openai SDK's `code`), status 500 as the server sent.

Straight to llama-server the same requests get its own error, which no agent classifies.
Both builds (wasm and the native module) run.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.harness.servers import start_or_fail
from tests.llamacpp.stack import MODEL, LlamaServer, plugin_config, start_envoy

CTX = 256
FULL = "Context size has been exceeded."
# About 120 tokens with the chat template: two fit the cache together, not with their output.
PROMPT = "Count: " + " ".join(str(k) for k in range(40))
# About 180 tokens: does not fit beside an answer under way.
LONG_PROMPT = "Say: " + " ".join(str(k) for k in range(60))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llamacpp-shared"), ctx=CTX,
                         args=("--parallel", "2", "--kv-unified"))
    start_or_fail(server, "llama-server (two slots, one KV cache)")
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["wasm", "module"])
def through(request, shared, tmp_path_factory):
    """Envoy + incontext in front of it, each build in turn."""
    glue = request.param
    try:
        env = start_envoy(tmp_path_factory.mktemp(f"llamacpp-shared-{glue}"),
                          f"envoy-llamacpp-shared-{glue}", shared.port,
                          plugin_config(shared.port), glue=glue)
    except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the tests
        pytest.fail(f"Envoy with the llamacpp backend could not be started: {e}",
                    pytrace=False)
    yield env.url
    env.stop()


def body(path: str, prompt: str, stream: bool = True) -> dict:
    b = {"model": MODEL, "stream": stream, "temperature": 0, "ignore_eos": True}
    if path == "/v1/responses":
        return {**b, "input": prompt, "max_output_tokens": 240}
    return {**b, "messages": [{"role": "user", "content": prompt}], "max_tokens": 240}


def stream_all(base: str, path: str, started=None):
    """Streams one request to its end: status, headers, body. ``started`` is set once the
    first bytes arrive."""
    with httpx.Client(base_url=base, timeout=120) as c:
        with c.stream("POST", path, json=body(path, PROMPT)) as r:
            data = b""
            for chunk in r.iter_raw():
                data += chunk
                if started is not None:
                    started.set()
            return r.status_code, dict(r.headers), data


def together(base: str, paths) -> dict:
    """The streams at once, started together: path -> (status, headers, body)."""
    out, gate = {}, threading.Barrier(len(paths))

    def one(path):
        gate.wait()
        out[path] = stream_all(base, path)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


def overlapping(base: str, paths, path: str, ended_on_its_cap) -> dict:
    """``together``, again while the stream of ``path`` ran to its cap: the two did not share
    the cache at once (on a busy machine one can end before the other starts). Tried up to
    five times; the last try is returned either way."""
    for _ in range(5):
        got = together(base, paths)
        if not ended_on_its_cap(events(got[path][2])):
            break
    return got


def events(data: bytes):
    """The stream's events: (event name or None, data text)."""
    found = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        name, lines = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                lines.append(line[5:].lstrip())
        found.append((name, "\n".join(lines)))
    return found


def test_the_server_says_it_straight(shared):
    got = together(shared.url, ["/v1/chat/completions", "/v1/messages"])
    chat = events(got["/v1/chat/completions"][2])
    assert json.loads(chat[-1][1]) == {"error": {"code": 500, "message": FULL,
                                                 "type": "server_error"}}, chat[-3:]
    anth = events(got["/v1/messages"][2])
    assert anth[-1][0] == "error" and json.loads(anth[-1][1])["message"] == FULL, anth[-3:]


def test_started_streams_end_as_the_window_ended_them(through):
    got = overlapping(through, ["/v1/chat/completions", "/v1/messages"], "/v1/messages",
                      lambda ev: any(name == "message_delta" and '"max_tokens"' in d
                                     for name, d in ev))
    status, headers, data = got["/v1/chat/completions"]
    chat = events(data)
    assert status == 200 and len(chat) > 3, data[-300:]
    assert not any("error" in d for _, d in chat), chat[-3:]
    assert chat[-2:] == [(None, json.dumps({"choices": [{"index": 0, "delta": {}, "text": "",
                                                         "finish_reason": "length"}]},
                                           separators=(",", ":"))),
                         (None, "[DONE]")], chat[-3:]

    status, headers, data = got["/v1/messages"]
    anth = events(data)
    assert status == 200, data[-300:]
    deltas = sum(1 for name, _ in anth if name == "content_block_delta")
    # The block under way is closed first; a window that ended the answer before its first
    # block (a busy machine can start it later than the other) leaves none to close.
    ending = ["message_delta", "message_stop"]
    if any(name == "content_block_start" for name, _ in anth):
        ending = ["content_block_stop"] + ending
    assert [name for name, _ in anth[-len(ending):]] == ending, anth[-4:]
    assert json.loads(anth[-2][1]) == {
        "type": "message_delta",
        "delta": {"stop_reason": "model_context_window_exceeded", "stop_sequence": None},
        "usage": {"output_tokens": deltas}}, anth[-2:]
    # The filter wrote caps that fit the slot's window alone.
    cap = int(headers["x-incontext-max-tokens"])
    assert int(headers["x-incontext-prompt-tokens"]) + cap <= CTX, headers


def test_a_started_responses_stream_fails_with_context_length_exceeded(through):
    got = overlapping(through, ["/v1/responses", "/v1/chat/completions"], "/v1/responses",
                      lambda ev: bool(ev) and ev[-1][0] == "response.completed")
    status, _, data = got["/v1/responses"]
    resp = events(data)
    assert status == 200, data[-300:]
    assert resp[-1][0] == "response.failed", resp[-2:]
    failed = json.loads(resp[-1][1])
    assert failed["response"]["error"]["code"] == "context_length_exceeded", failed


def test_before_any_output_the_window_error(through):
    """A request whose prompt cannot be held beside an answer under way fails before its
    output: the OpenAI window error, with the filter's numbers. The answer under way must
    still be going when it arrives: tried up to five times."""
    for _ in range(5):
        started = threading.Event()
        a = {}
        t = threading.Thread(target=lambda: a.update(
            r=stream_all(through, "/v1/chat/completions", started)))
        t.start()
        assert started.wait(60)
        r = httpx.post(through + "/v1/chat/completions",
                       json=body("/v1/chat/completions", LONG_PROMPT, stream=False), timeout=120)
        t.join(120)
        if r.status_code != 200:
            break
    assert r.status_code == 500, r.text[:300]
    p, b = int(r.headers["x-incontext-prompt-tokens"]), int(r.headers["x-incontext-max-tokens"])
    assert r.json() == {"error": {
        "message": f"This model's maximum context length is {CTX} tokens. However, your "
                   f"messages resulted in {p + b} tokens ({p} in the messages, {b} in the "
                   "completion). Please reduce the length of the messages or completion.",
        "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}}, r.text
