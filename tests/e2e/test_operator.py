"""docs/spec.md §9: what operators see: response headers, Envoy stats, and logs free of prompt text."""

import json
import re
import uuid

import pytest

from tests.e2e.common import (HEADER_NAMES, W, assert_rewritten, assert_unchanged, cfg, chat,
                        completion, dumps)
from tests.harness.envoy import FILTER_LOG, STAT_PREFIX
from tests.harness.spec import estimate

COUNTERS = ["incontext_requests", "incontext_rewritten", "incontext_rejected",
            "incontext_tokenizer_calls", "incontext_cache_hits", "incontext_cache_misses",
            "incontext_estimates"]
REASONS = ["method", "encoding", "too_large", "not_json", "not_object", "shape", "model",
           "no_cap", "no_window", "window_config", "insufficient", "internal"]
FAILURE_KINDS = ["dispatch", "transport", "timeout", "status", "bad_json", "contract", "mismatch"]


def test_headers_when_rewritten(proxy, upstream):
    upstream.tokenizer.count(100)
    res = proxy.post(chat(max_tokens=100000))
    assert res.h("x-incontext-action") == "rewritten"
    assert res.h("x-incontext-prompt-tokens") == "100"
    assert res.h("x-incontext-source") == "exact"
    assert res.h("x-incontext-max-tokens") == str(W - 100)


def test_headers_when_unchanged_after_count(proxy, upstream):
    upstream.tokenizer.count(W)
    res = proxy.post(chat(max_tokens=100000))
    assert res.h("x-incontext-action") == "unchanged:insufficient"
    assert res.h("x-incontext-prompt-tokens") == str(W)
    assert res.h("x-incontext-source") == "exact"
    assert res.h("x-incontext-max-tokens") is None


def test_headers_when_unchanged_without_count(proxy, upstream):
    res = proxy.post(b"not json")
    assert res.h("x-incontext-action") == "unchanged:not_json"
    for h in ("x-incontext-prompt-tokens", "x-incontext-source", "x-incontext-max-tokens"):
        assert res.h(h) is None, (h, res.describe())


def test_headers_on_estimate(proxy, upstream):
    upstream.tokenizer.status(500)
    res = proxy.post(chat(max_tokens=100000))
    assert res.h("x-incontext-source") == "estimate"
    assert res.h("x-incontext-prompt-tokens") == str(estimate(res.sent))


def test_response_headers_false(proxy_for, upstream):
    p = proxy_for(cfg(response_headers=False))
    upstream.tokenizer.count(100)
    res = p.post(chat(max_tokens=100000))
    assert res.json_up()["max_tokens"] == W - 100, res.json_up()  # still rewritten
    for h in HEADER_NAMES:
        assert res.h(h) is None, (h, res.describe())
    res = p.get()
    for h in HEADER_NAMES:
        assert res.h(h) is None
    assert res.delta.get("incontext_requests") == 1  # still counted


def test_upstream_response_body_untouched(proxy, upstream):
    upstream.tokenizer.count(100)
    res = proxy.post(chat(max_tokens=100000))
    echo = res.response.json()
    assert echo["body_len"] == len(res.body_up)
    assert res.response.headers.get("content-type") == "application/json"


def test_streamed_response_passes_through(proxy, upstream):
    """The filter works on the request only: a streamed (SSE) answer arrives event by event."""
    import hashlib
    import time

    upstream.tokenizer.count(100)
    body = dumps(chat(max_tokens=100000, stream=True))
    events, first_at = [], None
    start = time.monotonic()
    with proxy.client.stream("POST", "/v1/chat/completions", content=body,
                             headers={"content-type": "application/json", "x-test-stream": "10"}) as r:
        assert r.status_code == 200
        assert r.headers.get("x-incontext-action") == "rewritten"
        assert r.headers.get("x-incontext-max-tokens") == str(W - 100)
        for line in r.iter_lines():
            if line.startswith("data: "):
                first_at = first_at or time.monotonic() - start
                events.append(line[6:])
    assert events[-1] == "[DONE]" and len(events) == 11
    total = time.monotonic() - start
    assert first_at < total - 0.5, f"first event at {first_at:.2f}s of {total:.2f}s: buffered"
    (rec,) = upstream.snapshot()
    assert json.loads(events[0])["body_sha256"] == hashlib.sha256(rec.body).hexdigest()
    assert json.loads(rec.body)["max_tokens"] == W - 100


def test_counters_in_stats(proxy, upstream):
    upstream.tokenizer.count(100)
    res = proxy.post(chat(max_tokens=100000))
    d = res.delta
    for name, want in [("incontext_requests", 1), ("incontext_rewritten", 1),
                       ("incontext_tokenizer_calls", 1), ("incontext_cache_misses", 1)]:
        assert d.get(name) == want, (name, d)
    assert d.get("incontext_estimates", 0) == 0 and d.get("incontext_cache_hits", 0) == 0

    res = proxy.post(res.sent)  # identical: a cache hit
    assert res.delta.get("incontext_cache_hits") == 1 and res.delta.get("incontext_rewritten") == 1
    assert res.delta.get("incontext_tokenizer_calls", 0) == 0

    res = proxy.get()
    assert res.delta.get("incontext_unchanged_method") == 1, res.delta
    assert res.delta.get("incontext_requests") == 1

    res = proxy.post(completion(), path="/v1/completions")
    assert res.delta.get("incontext_unchanged_no_cap") == 1, res.delta

    upstream.tokenizer.garbage()
    res = proxy.post(chat(max_tokens=100000))
    assert res.delta.get("incontext_tokenizer_failures_bad_json") == 1, res.delta
    assert res.delta.get("incontext_estimates") == 1, res.delta
    assert res.delta.get("incontext_tokenizer_calls") == 1, res.delta


@pytest.mark.parametrize("body,reason", [(b"[]", "not_object"), (b"{", "not_json"),
                                         (b'{"messages":5}', "shape")])
def test_unchanged_reason_counters(proxy, upstream, body, reason):
    res = proxy.post(body)
    assert_unchanged(res, reason)
    assert res.delta.get(f"incontext_unchanged_{reason}") == 1, res.delta


def test_all_counters_listed(proxy):
    proxy.post(b"x")
    names = proxy.envoy.counters()
    missing = [c for c in COUNTERS + [f"incontext_unchanged_{r}" for r in REASONS]
               + [f"incontext_tokenizer_failures_{k}" for k in FAILURE_KINDS] if c not in names]
    assert not missing, f"counters not visible in /stats: {missing}"


def test_prometheus(proxy, upstream):
    upstream.tokenizer.count(100)
    before = proxy.envoy.prometheus()
    proxy.post(chat(max_tokens=100000))
    text = proxy.envoy.prometheus()
    # Envoy 1.40 prints the filter's counters without its `envoy_` / `wasmcustom_` (or
    # `dynamicmodulescustom_`) prefixes (`incontext_requests`); the `envoy_<prefix>_<name>`
    # form other Envoy versions print is accepted too.
    prefix = STAT_PREFIX[proxy.envoy.glue]
    for name in ("incontext_requests", "incontext_rewritten", "incontext_tokenizer_calls"):
        pat = rf"^(?:envoy_{prefix}_)?{name}(?:{{[^}}]*}})? (\d+)"
        m = re.search(pat, text, re.M)
        assert m, f"{name} not in /stats/prometheus"
        m0 = re.search(pat, before, re.M)
        assert int(m.group(1)) == (int(m0.group(1)) if m0 else 0) + 1, name
    assert re.search(rf"^# TYPE (?:envoy_{prefix}_)?incontext_requests counter", text, re.M)


def test_logs_never_carry_prompt_text(proxy_for, upstream):
    """Canary: a unique string in prompts, client headers and tokenizer error bodies must never
    reach Envoy's log, whatever path the request takes."""
    canary = "CANARY" + uuid.uuid4().hex
    p = proxy_for(cfg(on_insufficient="reject"), fresh=True)
    hdrs = {"authorization": f"Bearer {canary}", "x-user": canary, "cookie": f"c={canary}"}

    def body(**kw):
        return chat(f"secret {canary} {uuid.uuid4().hex}", **kw)

    upstream.tokenizer.count(100)
    assert p.post(body(max_tokens=100000), headers=hdrs).action == "rewritten"
    upstream.tokenizer.count(W)
    assert p.post(body(max_tokens=100000), headers=hdrs).status == 400  # rejected
    for action in [("raw", 500, f'{{"error":"{canary}"}}'.encode(), "application/json"),
                   ("raw", 200, f"<{canary}>".encode(), "text/html"),
                   ("json", 200, {"count": canary, "max_model_len": 32768, "detail": canary}),
                   ("json", 200, {"count": 5, "max_model_len": 7, "detail": canary}),
                   ("raw", 404, canary.encode(), "text/plain")]:
        upstream.tokenizer.always(action)
        assert p.post(body(max_tokens=100000), headers=hdrs).source == "estimate"
    upstream.tokenizer.count(100)
    p.post(f'{{"messages": "{canary}"}}'.encode(), headers=hdrs)
    p.post(f"not json {canary}".encode(), headers=hdrs)
    p.post(dumps(completion(canary, max_tokens=5)), path="/v1/completions", headers=hdrs)
    p.post(dumps(body(response_format={"type": "json_object"})), headers=hdrs)
    p.send("GET", f"/v1/models?{canary}", None, hdrs)
    p.envoy.stop()  # flush the log
    log = p.envoy.log_bytes()
    assert FILTER_LOG[p.envoy.glue].encode() in log, "the Envoy log does not show the filter at all"
    assert canary.encode() not in log, "canary found in the Envoy log: " + next(
        l for l in log.decode("utf-8", "replace").splitlines() if canary in l)[:300]
    assert b"secret " not in log
