"""docs/spec.md §13, the answer side, through the real Envoy against scripted answers: a window
error reaches the client in its dialect, every other answer byte for byte (huge or non-JSON
error bodies, look-alikes, content-encoding, 5xx, successes), the Anthropic stop reason in JSON
and in a split SSE stream that is never held (lines ended by LF, CR or CRLF), a stream that ends
mid-event; no server text in the log. Answers that end in trailers: test_answer_ends.py."""

import gzip
import json
import threading

import httpx
import pytest

from tests.e2e.common import C, F, MODEL, cfg, chat, dumps, nonce
from tests.harness.spec import estimate
from tests.harness.upstream import Answer, Gate, ok

CANARY = "canary-" + "q7w3e9"

PROMPT_TOO_LONG = (
    f"This model's maximum context length is {C} tokens. However, your prompt contains at least "
    f"{C + 1} input tokens, which exceeds this limit even without any output tokens. Please "
    f"reduce the length of the input prompt. (parameter=input_tokens, value={C + 1})")
CAP_TOO_LARGE = (
    f"max_tokens=100000 cannot be greater than max_model_len={C}. Please request fewer output "
    "tokens. (parameter=max_tokens, value=100000)")


def vllm_error(message: str) -> bytes:
    """vLLM 0.32's error body, on every path."""
    return json.dumps({"error": {"message": message, "type": "BadRequestError",
                                 "param": "input_tokens", "code": 400}}).encode()


def scripted(upstream, answer: Answer) -> dict:
    name = nonce()
    upstream.answers[name] = answer
    return {"x-test-answer": name}


def pieces(body: bytes, n: int):
    step = max(1, len(body) // n)
    return [body[i:i + step] for i in range(0, len(body), step)]


def test_window_error_translated_for_openai(proxy, upstream):
    """An exact prompt over the window: unchanged, the server's 400 becomes
    context_length_exceeded, the body split in many chunks changes nothing."""
    upstream.tokenizer.always(ok(C + 500))
    body = vllm_error(PROMPT_TOO_LONG)
    h = scripted(upstream, Answer(400, pieces(body, 9), pause=0.02))
    res = proxy.post(chat(max_tokens=100000), headers=h)
    assert res.status == 400, res.describe()
    assert res.action == "unchanged:insufficient", res.describe()
    err = res.response.json()["error"]
    assert err["code"] == "context_length_exceeded", err
    assert err["type"] == "invalid_request_error" and err["param"] == "messages", err
    assert err["message"] == (f"This model's maximum context length is {C} tokens. However, your "
                              f"messages resulted in {C + 500} tokens. Please reduce the length "
                              "of the messages."), err
    assert res.delta.get("incontext_translated") == 1, res.delta
    # Envoy frames the new body itself: no stale Content-Length.
    cl = res.h("content-length")
    assert cl is None or int(cl) == len(res.response.content), res.describe()


def test_prompt_and_cap_for_anthropic(proxy, upstream):
    """Anthropic, estimated prompt below the window: vLLM's cap error becomes "input length and
    `max_tokens` exceed context limit", with the cap the server saw."""
    msgs = {"model": MODEL, "max_tokens": 100000,
            "messages": [{"role": "user", "content": f"hi {nonce()}"}]}
    h = scripted(upstream, Answer(400, [vllm_error(CAP_TOO_LARGE)]))
    res = proxy.post(msgs, path="/v1/messages", headers=h)
    assert res.status == 400, res.describe()
    v = res.response.json()
    assert v["type"] == "error" and v["error"]["type"] == "invalid_request_error", v
    written = int(res.h("x-incontext-max-tokens"))
    P = int(res.h("x-incontext-prompt-tokens"))
    assert v["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {P} + 100000 > {C}, decrease "
        "input length or `max_tokens` and try again"), (v, written)


def test_other_errors_arrive_byte_for_byte(proxy, upstream):
    upstream.tokenizer.always(ok(C + 500))
    look_alike = json.dumps({"error": {"message": f"This model's maximum context length is {C} "
                                       f"tokens. {CANARY}", "code": 400}}).encode()
    other = json.dumps({"error": {"message": f"temperature must be >= 0 {CANARY}",
                                  "type": "BadRequestError", "code": 400}}).encode()
    huge = vllm_error(PROMPT_TOO_LONG + " " + "x" * (70 * 1024))
    gz = gzip.compress(vllm_error(PROMPT_TOO_LONG))
    cases = {
        "look-alike": Answer(400, [look_alike]),
        "other 400": Answer(400, pieces(other, 3), length=True),
        "not JSON": Answer(400, [b"<html>400 " + CANARY.encode() + b"</html>"],
                           headers=[("Content-Type", "text/html")]),
        "not JSON said to be JSON": Answer(400, [b"{\"error\": " + CANARY.encode()]),
        "huge window error": Answer(400, pieces(huge, 4)),
        "huge with a length": Answer(400, [huge], length=True),
        "gzip": Answer(400, [gz], headers=[("Content-Type", "application/json"),
                                           ("Content-Encoding", "gzip")], length=True),
        "5xx with the window text": Answer(500, [vllm_error(PROMPT_TOO_LONG)]),
        "413": Answer(413, [b"too large"], headers=[("Content-Type", "text/plain")]),
    }
    for name, answer in cases.items():
        want = b"".join(answer.pieces)
        h = scripted(upstream, answer)
        with httpx.Client(base_url=proxy.envoy.url, timeout=30) as c:
            # The raw bytes as they came, without httpx decoding gzip.
            with c.stream("POST", "/v1/chat/completions", content=dumps(chat(max_tokens=100000)),
                          headers={"content-type": "application/json", **h}) as r:
                got = b"".join(r.iter_raw())
                assert r.status_code == answer.status, name
        assert got == want, f"{name}: {got[:200]!r}"
    assert CANARY not in proxy.envoy.log_text()
    assert "maximum context length" not in proxy.envoy.log_text()


def test_successful_answers_pass_unchanged(proxy, upstream):
    upstream.tokenizer.always(ok(100))
    body = json.dumps({"choices": [{"finish_reason": "length"}], "x": "y" * 100000}).encode()
    h = scripted(upstream, Answer(200, pieces(body, 5), length=True))
    res = proxy.post(chat(max_tokens=100000), headers=h)
    assert res.action == "rewritten", res.describe()
    assert res.response.content == body
    assert res.h("content-length") == str(len(body)), "a success keeps its length"


def messages_body(cap=32000, **extra) -> dict:
    body = {"model": MODEL, "max_tokens": cap,
            "messages": [{"role": "user", "content": f"hello {nonce()}"}]}
    body.update(extra)
    return body


def written_by_window(res) -> int:
    """The cap the filter wrote (the count call fails here: the estimate + F decides)."""
    P = estimate(res.sent)
    value = int(res.h("x-incontext-max-tokens"))
    assert value == C - P - F, res.describe()
    return value


def anthropic_json(stop: str, output: str) -> bytes:
    return (b'{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text",'
            b'"text":"\\"stop_reason\\":\\"max_tokens\\""}],"model":"m","stop_reason":"'
            + stop.encode() + b'","stop_sequence":null,"usage":{"input_tokens":9,'
            b'"output_tokens":' + output.encode() + b'}}')


def test_anthropic_json_stop_reason(proxy, upstream):
    body = anthropic_json("max_tokens", "{max_tokens}")
    h = scripted(upstream, Answer(200, pieces(body, 3), length=True))
    res = proxy.post(messages_body(), path="/v1/messages", headers=h)
    value = written_by_window(res)
    assert res.status == 200, res.describe()
    want = body.replace(b"{max_tokens}", str(value).encode()).replace(
        b'"stop_reason":"max_tokens"', b'"stop_reason":"model_context_window_exceeded"')
    assert res.response.content == want
    assert res.delta.get("incontext_window_stop") == 1, res.delta
    # The caller's own cap ended it: "max_tokens" stays, byte for byte.
    small = anthropic_json("max_tokens", "{max_tokens}")
    h = scripted(upstream, Answer(200, [small], length=True))
    res = proxy.post(messages_body(cap=500), path="/v1/messages", headers=h)
    assert res.response.content == small.replace(b"{max_tokens}", b"500")
    assert res.h("content-length") is not None
    # Fewer tokens than the written cap: unchanged.
    other = anthropic_json("max_tokens", "7")
    h = scripted(upstream, Answer(200, [other], length=True))
    res = proxy.post(messages_body(), path="/v1/messages", headers=h)
    assert res.response.content == other


def sse(events) -> bytes:
    return b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(data).encode())
                    for name, data in events)


STREAM_HEAD = [("message_start", {"type": "message_start", "message": {"id": "m", "content": []}}),
               ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": "message_delta"}})]


@pytest.mark.parametrize("end", [b"\n", b"\r", b"\r\n"], ids=["lf", "cr", "crlf"])
def test_anthropic_stream_split_and_never_held(proxy, upstream, end):
    """Lines ended by LF, CR alone or CRLF alike: the first events reach the client before
    the last piece is sent, and the message_delta, split in three, is rewritten."""
    delta = sse([("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                    "usage": {"output_tokens": 999999}})])
    delta = delta.replace(b"999999", b"{max_tokens}").replace(b"\n", end)
    head = sse(STREAM_HEAD).replace(b"\n", end)
    stop = sse([("message_stop", {"type": "message_stop"})]).replace(b"\n", end)
    # The delta event split in three chunks; the last piece waits until the client has read
    # the first events: a held stream would never get there.
    gate = Gate(hold_limit=30)
    cut = [delta[:17], delta[17:60], delta[60:]]
    answer = Answer(200, [head, *cut, stop], headers=[("Content-Type", "text/event-stream")],
                    pause=0.05, gate=gate)
    h = scripted(upstream, answer)
    got, before_gate = b"", None
    with httpx.Client(base_url=proxy.envoy.url, timeout=30) as c:
        with c.stream("POST", "/v1/messages", content=dumps(messages_body(stream=True)),
                      headers={"content-type": "application/json", **h}) as r:
            value = int(r.headers["x-incontext-max-tokens"])
            for chunk in r.iter_raw():
                got += chunk
                if head in got and before_gate is None:
                    before_gate = got
                    gate.open()
    assert before_gate is not None and stop not in before_gate, before_gate
    want = head + delta.replace(b"{max_tokens}", str(value).encode()).replace(
        b'"stop_reason": "max_tokens"', b'"stop_reason": "model_context_window_exceeded"') + stop
    assert got == want, got


def test_stream_ending_mid_event_passes_unchanged(proxy, upstream):
    partial = b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "max_'
    answer = Answer(200, [sse(STREAM_HEAD), partial], headers=[("Content-Type", "text/event-stream")])
    h = scripted(upstream, answer)
    res = proxy.post(messages_body(stream=True), path="/v1/messages", headers=h)
    assert res.status == 200
    assert res.response.content == sse(STREAM_HEAD) + partial


def test_translation_off(proxy_for, upstream):
    p = proxy_for(cfg(translate_errors=False))
    upstream.tokenizer.always(ok(C + 500))
    body = vllm_error(PROMPT_TOO_LONG)
    res = p.post(chat(max_tokens=100000), headers=scripted(upstream, Answer(400, [body])))
    assert res.status == 400 and res.response.content == body


def test_concurrent_answers_each_their_own(proxy, upstream):
    """Many streams at once, errors and successes interleaved: each gets its own answer."""
    upstream.tokenizer.always(ok(C + 500))
    results = {}

    def one(i):
        if i % 2:
            ans = Answer(400, pieces(vllm_error(PROMPT_TOO_LONG), 4), pause=0.01)
        else:
            ans = Answer(200, [b'{"i": %d}' % i], length=True)
        h = scripted(upstream, ans)
        with httpx.Client(base_url=proxy.envoy.url, timeout=30) as c:
            r = c.post("/v1/chat/completions", content=dumps(chat(max_tokens=100000)),
                       headers={"content-type": "application/json", **h})
            results[i] = (r.status_code, r.content)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, content) in results.items():
        if i % 2:
            assert status == 400 and json.loads(content)["error"]["code"] == "context_length_exceeded"
        else:
            assert (status, content) == (200, b'{"i": %d}' % i)
