"""docs/spec.md §6: counts are cached in shared data, across worker threads; failures are not."""

import httpx

from tests.e2e.common import (C, Proxy, assert_rewritten, assert_unchanged, cfg, chat, dumps, nonce)
from tests.harness.spec import estimate


def test_identical_request_twice_one_tokenizer_call(proxy, upstream):
    upstream.tokenizer.count(1234)
    body = dumps(chat(max_tokens=100000))
    first = proxy.post(body)
    assert_rewritten(first, 1234)
    assert len(first.tokenize) == 1
    second = proxy.post(body)
    assert len(second.tokenize) == 0, second.describe()
    assert_rewritten(second, 1234, source="cache")
    assert second.body_up == first.body_up
    assert second.delta.get("incontext_cache_hits") == 1, second.delta
    assert first.delta.get("incontext_cache_misses") == 1, first.delta


def test_cache_key_ignores_caps_and_sampling(proxy, upstream):
    """Only the tokenize payload is hashed: another cap or temperature is still a hit."""
    upstream.tokenizer.count(2000)
    content = "same prompt " + nonce()
    first = proxy.post(chat(content, max_tokens=100000))
    assert_rewritten(first, 2000)
    upstream.tokenizer.count(9999)  # would change the result if it were asked again
    second = proxy.post(chat(content, max_tokens=50, temperature=0.1, stream=True))
    assert len(second.tokenize) == 0, second.describe()
    assert_rewritten(second, 2000, source="cache")


def test_cache_is_shared_by_all_workers(proxy, upstream):
    """Envoy runs 2 workers; new connections land on either; still only one tokenizer call."""
    upstream.tokenizer.count(500)
    body = dumps(chat(max_tokens=100000))
    sources = []
    for _ in range(12):
        with httpx.Client(base_url=proxy.envoy.url, timeout=30) as c:
            r = c.post("/v1/chat/completions", content=body,
                       headers={"content-type": "application/json", "connection": "close"})
            assert r.status_code == 200
            assert r.headers.get("x-incontext-action") == "rewritten", r.headers
            assert r.headers.get("x-incontext-max-tokens") == str(C - 500)
            sources.append(r.headers.get("x-incontext-source"))
    assert len(upstream.tokenizer.snapshot()) == 1, sources
    assert sources[0] == "exact" and set(sources[1:]) == {"cache"}, sources


def test_different_prompt_is_a_miss(proxy, upstream):
    upstream.tokenizer.count(100)
    assert len(proxy.post(chat()).tokenize) == 1
    assert len(proxy.post(chat()).tokenize) == 1


def test_failures_are_not_cached(proxy, upstream):
    body = dumps(chat(max_tokens=100000))
    upstream.tokenizer.status(500)
    first = proxy.post(body)
    assert first.source == "estimate", first.describe()
    assert_rewritten(first, estimate(body), exact=False)
    upstream.tokenizer.count(700)
    second = proxy.post(body)
    assert len(second.tokenize) == 1, second.describe()
    assert_rewritten(second, 700)


def test_insufficient_result_is_cached_too(proxy, upstream):
    upstream.tokenizer.count(C - 10)
    body = dumps(chat(max_tokens=100000))
    assert_unchanged(proxy.post(body), "insufficient", tokenize_calls=1)
    res = proxy.post(body)
    assert_unchanged(res, "insufficient", tokenize_calls=0)
    assert res.source == "cache"


def test_cache_is_bounded(proxy_for, upstream):
    """2 entries round up to one set of 16 (docs/spec.md §6): of 20 prompts, the 16 stored
    last are held, the 4 stored first were evicted."""
    p = proxy_for(cfg(cache_entries=2))
    upstream.tokenizer.count(100)
    bodies = [dumps(chat(max_tokens=100000)) for _ in range(20)]
    for b in bodies:
        assert_rewritten(p.post(b), 100)
    assert len(upstream.tokenizer.snapshot()) == 20
    for b in bodies[4:]:
        assert p.post(b).source == "cache"
    assert len(upstream.tokenizer.snapshot()) == 20
    for b in bodies[:4]:
        assert_rewritten(p.post(b), 100)
    assert len(upstream.tokenizer.snapshot()) == 24


def test_other_context_length_counts_again(proxy_for, upstream):
    """A configuration with another C asks the tokenizer again and budgets with that C."""
    body = dumps(chat(max_tokens=100000))
    upstream.tokenizer.count(100)
    p1 = proxy_for(cfg())
    assert len(p1.post(body).tokenize) == 1
    p2 = proxy_for(cfg(context_length=16384, window_tokens=16384))
    upstream.tokenizer.count(100, max_model_len=16384)
    res = p2.post(body)
    assert len(res.tokenize) == 1, res.describe()
    assert_rewritten(res, 100, W_=16384, C_=16384)


def test_hit_still_judges_the_rest_of_the_body(proxy, upstream):
    """A cache hit skips re-validating `messages`/`tools` (their bytes are what the key hashes),
    never the rest: the same messages with a broken member elsewhere, or with a broken earlier
    duplicate `messages`, is not JSON and passes byte for byte."""
    upstream.tokenizer.count(700)
    body = chat(max_tokens=100000, tools=[{"type": "function", "function": {"name": "f"}}])
    first = proxy.post(dumps(body))
    assert_rewritten(first, 700)
    again = proxy.post(dumps(body))
    assert_rewritten(again, 700, source="cache")
    text = dumps(body)
    assert text.endswith(b"}")
    for broken in (
        text[:-1] + b', "temperature": 01}',                  # a bad number after the cached parts
        text[:-1] + b', "stop": ["a",]}',                     # a trailing comma
        b'{"messages": [1,], ' + text[1:],                    # an invalid earlier duplicate
        text[:-1] + b', "x": "\xff"}',                        # invalid UTF-8
    ):
        res = proxy.post(broken)
        assert_unchanged(res, "not_json", tokenize_calls=0)
        assert res.delta.get("incontext_cache_hits") is None, res.delta


def test_broken_messages_are_never_served_from_the_cache(proxy, upstream):
    """Invalid JSON inside `messages` is judged on the miss path: not_json, nothing cached."""
    upstream.tokenizer.count(300)
    good = dumps(chat(max_tokens=100000))
    i = good.index(b'"role"')
    broken = good[:i] + b'"role" "system", ' + good[i:]      # a missing colon inside messages
    for _ in range(2):
        res = proxy.post(broken)
        assert_unchanged(res, "not_json", tokenize_calls=0)
        assert res.delta.get("incontext_cache_misses") is None, res.delta
