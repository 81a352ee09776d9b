"""docs/spec.md §13 at the ends of an answer, through the real Envoy against scripted answers.

* An answer that ends in trailers (HTTP/1 chunked trailers from the upstream, read by an Envoy
  whose `vllm` cluster has HTTP/1 trailers on; the client reads over HTTP/2, which carries
  them) reaches the client whole, edited as at the end of a body, its trailers after it: a
  watched Anthropic JSON answer with its stop reason rewritten, a window error translated.
* A CR-framed SSE stream whose message_delta, its last event, ends in trailers without its
  blank line: the event goes before them, rewritten. (Streams framed with CR alone or CRLF
  otherwise: test_answers.test_anthropic_stream_split_and_never_held.)
"""

import json

import httpx
import pytest

from tests.e2e.common import C, F, MAIN, chat, dumps, h2_post
from tests.e2e.test_answers import (PROMPT_TOO_LONG, STREAM_HEAD, anthropic_json, messages_body,
                                    pieces, scripted, sse, vllm_error)
from tests.harness.spec import estimate
from tests.harness.upstream import Answer, Gate, ok

TRAILERS = [("x-upstream-trailer", "t1"), ("x-checksum", "abc")]
WINDOW_STOP = b'"stop_reason":"model_context_window_exceeded"'


@pytest.fixture
def tp(proxy_for):
    """A proxy through an Envoy that passes HTTP/1 trailers."""
    return proxy_for(MAIN, trailers=True)


def post_h2(p, path: str, body: dict, upstream, answer: Answer):
    """The request over HTTP/2 with a scripted answer: the answer (with its trailers) and the
    change of the filter's counters."""
    before = p.envoy.counters()
    raw = dumps(body)
    a = h2_post(p.envoy.port, path, raw, headers=list(scripted(upstream, answer).items()))
    after = p.envoy.counters()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return a, raw, delta


def test_json_answer_ending_in_trailers_arrives_whole(tp, upstream):
    """The JSON answer's tail from `stop_reason` on is held until the answer ends: when it
    ends in trailers, the tail goes before them, rewritten (the count call fails here: the
    estimate + F decides the cap)."""
    body = anthropic_json("max_tokens", "{max_tokens}")
    at = body.index(b'"stop_reason"')
    # Cut inside the held tail, and before it: every piece its own chunk.
    for cuts in ([at + 5], [at - 20, at + 40], []):
        edges = [0, *cuts, len(body)]
        parts = [body[a:b] for a, b in zip(edges, edges[1:])]
        answer = Answer(200, parts, pause=0.02, trailers=TRAILERS)
        a, raw, delta = post_h2(tp, "/v1/messages", messages_body(), upstream, answer)
        assert a.status == 200, a
        value = int(dict(a.headers)["x-incontext-max-tokens"])
        assert value == C - estimate(raw) - F, a.headers
        want = body.replace(b"{max_tokens}", str(value).encode()).replace(
            b'"stop_reason":"max_tokens"', WINDOW_STOP)
        assert a.body == want, (cuts, a.body)
        assert json.loads(a.body)["stop_reason"] == "model_context_window_exceeded"
        assert a.trailers == TRAILERS, a.trailers
        assert "content-length" not in dict(a.headers)
        assert delta.get("incontext_window_stop") == 1, delta
    # The caller's own cap ended it: held the same, and sent unchanged before the trailers.
    small = anthropic_json("max_tokens", "7")
    a, _, delta = post_h2(tp, "/v1/messages", messages_body(),
                          upstream, Answer(200, pieces(small, 3), trailers=TRAILERS))
    assert (a.status, a.body, a.trailers) == (200, small, TRAILERS)
    assert "incontext_window_stop" not in delta, delta


def test_window_error_ending_in_trailers_is_translated(tp, upstream):
    upstream.tokenizer.always(ok(C + 500))
    error = vllm_error(PROMPT_TOO_LONG)
    a, _, delta = post_h2(tp, "/v1/chat/completions", chat(max_tokens=100000), upstream,
                          Answer(400, pieces(error, 4), pause=0.02, trailers=TRAILERS))
    assert a.status == 400, a
    assert dict(a.headers)["x-incontext-action"] == "unchanged:insufficient", a.headers
    err = json.loads(a.body)["error"]
    assert err["code"] == "context_length_exceeded", a.body
    assert err["message"] == (f"This model's maximum context length is {C} tokens. However, your "
                              f"messages resulted in {C + 500} tokens. Please reduce the length "
                              "of the messages."), err
    assert a.trailers == TRAILERS, a.trailers
    assert delta.get("incontext_translated") == 1, delta
    # Another error ending in trailers: byte for byte.
    other = json.dumps({"error": {"message": "temperature must be >= 0", "code": 400}}).encode()
    a, _, delta = post_h2(tp, "/v1/chat/completions", chat(max_tokens=100000), upstream,
                          Answer(400, pieces(other, 2), trailers=TRAILERS))
    assert (a.status, a.body, a.trailers) == (400, other, TRAILERS)
    assert "incontext_translated" not in delta, delta


ANNOUNCED = ("Trailer", "x-upstream-trailer, x-checksum")


def test_stream_ending_in_trailers_mid_event(tp, upstream):
    """A CR-framed stream whose message_delta, its last event, ends in the trailers its head
    announced without its blank line: the event goes before them, rewritten."""
    delta_event = sse([("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": "max_tokens"},
                                          "usage": {"output_tokens": 999999}})])
    delta_event = delta_event.replace(b"999999", b"{max_tokens}").rstrip(b"\n")
    stream = (sse(STREAM_HEAD) + delta_event).replace(b"\n", b"\r")
    answer = Answer(200, [stream[:60], stream[60:]], trailers=TRAILERS,
                    headers=[("Content-Type", "text/event-stream"), ANNOUNCED])
    a, _, delta = post_h2(tp, "/v1/messages", messages_body(stream=True), upstream, answer)
    value = dict(a.headers)["x-incontext-max-tokens"]
    want = stream.replace(b"{max_tokens}", value.encode()).replace(
        b'"stop_reason": "max_tokens"', b'"stop_reason": "model_context_window_exceeded"')
    assert a.body == want, a.body
    assert a.trailers == TRAILERS
    assert delta.get("incontext_window_stop") == 1, delta



def test_stream_ending_in_unannounced_trailers_mid_event(tp, upstream, glue):
    """The same stream without the announcement: its complete events passed as they came, so
    the wasm build has nothing the partial event could join at the trailers and ends the
    answer without it (no client dispatches an event cut before its blank line); the module
    adds it before them, rewritten."""
    delta_event = sse([("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": "max_tokens"},
                                          "usage": {"output_tokens": 999999}})])
    delta_event = delta_event.replace(b"999999", b"{max_tokens}").rstrip(b"\n")
    head = sse(STREAM_HEAD).replace(b"\n", b"\r")
    stream = head + delta_event.replace(b"\n", b"\r")
    answer = Answer(200, [stream[:len(head) + 30], stream[len(head) + 30:]], trailers=TRAILERS,
                    headers=[("Content-Type", "text/event-stream")])
    a, _, delta = post_h2(tp, "/v1/messages", messages_body(stream=True), upstream, answer)
    value = dict(a.headers)["x-incontext-max-tokens"]
    want = {"wasm": head,
            "module": stream.replace(b"{max_tokens}", value.encode()).replace(
                b'"stop_reason": "max_tokens"',
                b'"stop_reason": "model_context_window_exceeded"')}[glue]
    assert a.body == want, a.body
    assert a.trailers == TRAILERS
    assert delta.get("incontext_window_stop", 0) == {"wasm": 0, "module": 1}[glue], delta

def _chat_event(i: int, **extra) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "test/model",
             "choices": [{"index": 0, "delta": {"content": f"part {i} "}, "finish_reason": None}]}
    chunk.update(extra)
    return b"data: %s\n\n" % json.dumps(chunk).encode()


def _first_arrival(p, path: str, body: dict, upstream, first: bytes, rest: bytes):
    """The upstream sends ``first`` and holds ``rest`` until the client has read something (or
    for at most 1.5 s): what the client read before the rest was sent, all it read, and the
    cap the filter wrote."""
    gate = Gate(hold_limit=1.5)
    answer = Answer(200, [first, rest], headers=[("Content-Type", "text/event-stream")],
                    gate=gate)
    h = scripted(upstream, answer)
    got, before = b"", None
    with httpx.Client(base_url=p.envoy.url, timeout=30) as c:
        with c.stream("POST", path, content=dumps(body),
                      headers={"content-type": "application/json", **h}) as r:
            assert r.status_code == 200
            value = r.headers.get("x-incontext-max-tokens")
            for chunk in r.iter_raw():
                got += chunk
                if before is None:
                    before = got
                    gate.open()
    return before, got, value


def test_complete_events_pass_before_the_rest_arrives(proxy, upstream):
    """Three complete events and part of a fourth in one chunk, the rest 1.5 s later: the
    client reads the three complete events before the upstream sends the rest (only the
    partial event waits), and the whole stream as the upstream sent it, the message_delta
    rewritten. An OpenAI chat stream (read for its usage, never edited) passes as it comes."""
    head = sse(STREAM_HEAD + [("content_block_stop", {"type": "content_block_stop",
                                                       "index": 0})])
    delta = sse([("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "max_tokens"},
                                    "usage": {"output_tokens": 999999}})])
    delta = delta.replace(b"999999", b"{max_tokens}")
    stop = sse([("message_stop", {"type": "message_stop"})])
    first, rest = head + delta[:30], delta[30:] + stop
    before, got, value = _first_arrival(proxy, "/v1/messages", messages_body(stream=True),
                                        upstream, first, rest)
    assert before == head, before
    want = head + delta.replace(b"{max_tokens}", value.encode()).replace(
        b'"stop_reason": "max_tokens"', b'"stop_reason": "model_context_window_exceeded"') + stop
    assert got == want, got

    events = b"".join(_chat_event(i) for i in range(3))
    last = _chat_event(3, usage={"prompt_tokens": 20, "completion_tokens": 4,
                                 "total_tokens": 24})
    first, rest = events + last[:25], last[25:] + b"data: [DONE]\n\n"
    before, got, _ = _first_arrival(proxy, "/v1/chat/completions", chat(stream=True),
                                    upstream, first, rest)
    # A chat stream is only read: the partial event passes with them.
    assert before == first, before
    assert got == first + rest, got
