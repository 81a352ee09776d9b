"""docs/spec.md §4: which requests are budgeted; everything else goes upstream byte-identical."""

import gzip
import json

import pytest

from tests.e2e.common import (MODEL, W, assert_content_length, assert_rewritten, assert_unchanged, cfg,
                        chat, completion, dumps, nonce)


@pytest.mark.parametrize("body", [
    b"this is not json " + b"x" * 10,
    b'{"messages": [ {"role":"user","content":"unterminated"} ',
    b'{"model":"m","messages":[]}trailing',
])
def test_not_json_passes_unchanged(proxy, upstream, body):
    res = proxy.post(body)
    assert_unchanged(res, "not_json", tokenize_calls=0)


def test_empty_body_passes_unchanged(proxy, upstream):
    res = proxy.post(b"")
    assert res.status == 200
    assert res.action == "unchanged:not_json", res.describe()
    assert res.one.body == b"" and len(res.tokenize) == 0


def test_invalid_utf8_passes_unchanged(proxy, upstream):
    body = b'{"model":"m","messages":[{"role":"user","content":"\xff\xfe bad"}],"max_tokens":100000}'
    res = proxy.post(body)
    assert_unchanged(res, "not_json", tokenize_calls=0)


@pytest.mark.parametrize("body", [b'[{"messages":[]}]', b'"a string"', b"42", b"null", b"true"])
def test_not_object_passes_unchanged(proxy, upstream, body):
    res = proxy.post(body)
    assert_unchanged(res, "not_object", tokenize_calls=0)


@pytest.mark.parametrize("messages", ['"hello"', '{"role":"user","content":"x"}', "null", "42"])
def test_messages_not_array_passes_unchanged(proxy, upstream, messages):
    body = ('{"model":"m", "messages": ' + messages + ', "max_tokens": 100000, "n":"'
            + nonce() + '"}').encode()
    res = proxy.post(body)
    assert_unchanged(res, "shape", tokenize_calls=0)


def test_neither_messages_nor_prompt_passes_unchanged(proxy, upstream):
    res = proxy.post(b'{"model":"m", "input": "embed me", "max_tokens": 100000}', path="/v1/embeddings")
    assert_unchanged(res, "shape", tokenize_calls=0)


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_pass_unchanged(proxy, upstream, method):
    body = None if method in ("GET", "DELETE") else dumps(chat(max_tokens=100000))
    res = proxy.send(method, "/v1/chat/completions", body)
    assert res.status == 200
    assert res.action == "unchanged:method", res.describe()
    assert res.one.method == method
    assert res.one.body == (body or b"")
    assert len(res.tokenize) == 0


def test_get_models_passes(proxy, upstream):
    res = proxy.get("/v1/models")
    assert res.status == 200 and res.one.method == "GET" and res.one.path == "/v1/models"
    assert res.action == "unchanged:method", res.describe()
    assert len(res.tokenize) == 0


@pytest.mark.parametrize("enc", ["gzip", "br"])
def test_content_encoding_passes_unchanged(proxy, upstream, enc):
    body = gzip.compress(dumps(chat(max_tokens=100000)))
    res = proxy.post(body, headers={"content-encoding": enc})
    assert_unchanged(res, "encoding", tokenize_calls=0)
    assert res.one.header("content-encoding") == enc


def test_identity_encoding_is_budgeted(proxy, upstream):
    upstream.tokenizer.count(100)
    res = proxy.post(chat(max_tokens=100000), headers={"content-encoding": "identity"})
    assert_rewritten(res, 100)


def test_completion_with_cap_is_clamped(proxy, upstream):
    upstream.tokenizer.count(7000)
    res = proxy.post(completion(max_tokens=100000, temperature=0.2), path="/v1/completions")
    assert assert_rewritten(res, 7000).value == W - 7000


def test_completion_small_cap_kept(proxy, upstream):
    upstream.tokenizer.count(7000)
    res = proxy.post(completion(max_tokens=16), path="/v1/completions")
    assert assert_rewritten(res, 7000).value == 16


def test_completion_without_cap_passes_unchanged(proxy, upstream):
    res = proxy.post(completion(), path="/v1/completions")
    assert_unchanged(res, "no_cap", tokenize_calls=0)


def test_token_id_prompt_counted_by_length(proxy, upstream):
    ids = list(range(1000, 1000 + 2500))
    res = proxy.post(completion(prompt=ids, max_tokens=100000, user=nonce()), path="/v1/completions")
    assert len(res.tokenize) == 0, res.describe()
    assert assert_rewritten(res, len(ids)).value == W - len(ids)


def test_token_id_prompt_insufficient(proxy, upstream):
    ids = [5] * (W - 10)
    res = proxy.post(completion(prompt=ids, max_tokens=100000, user=nonce()), path="/v1/completions")
    assert_unchanged(res, "insufficient", tokenize_calls=0)


def test_chat_with_prompt_member_is_chat(proxy, upstream):
    upstream.tokenizer.count(50)
    res = proxy.post(chat(prompt="ignored", max_output_tokens=100000))
    d = assert_rewritten(res, 50)
    assert d.field == "max_tokens"  # chat form: max_output_tokens written as max_tokens


def test_model_filter(proxy_for, upstream):
    p = proxy_for(cfg(model=["allowed/a", "allowed/b"]))
    upstream.tokenizer.count(100)
    res = p.post(chat(model="other/model", max_tokens=100000))
    assert_unchanged(res, "model", tokenize_calls=0)
    res = p.post(chat(model="allowed/b", max_tokens=100000))
    assert_rewritten(res, 100)
    res = p.post(chat(max_tokens=100000, **{"model": None}))  # null model: not in the list
    assert_unchanged(res, "model", tokenize_calls=0)


def test_model_filter_single_name(proxy_for, upstream):
    p = proxy_for(cfg(model=MODEL))
    upstream.tokenizer.count(100)
    assert_rewritten(p.post(chat()), 100)
    assert_unchanged(p.post(chat(model=MODEL + "-2")), "model", tokenize_calls=0)


def test_body_over_max_body_bytes_passes_unchanged(proxy_for, upstream):
    p = proxy_for(cfg(max_body_bytes=4096))
    upstream.tokenizer.count(100)
    small = chat(max_tokens=100000)
    assert_rewritten(p.post(small), 100)
    big = chat("x" * 20000 + nonce(), max_tokens=100000)
    res = p.post(big)
    assert_unchanged(res, "too_large", tokenize_calls=0)


def test_body_just_over_max_body_bytes(proxy_for, upstream):
    p = proxy_for(cfg(max_body_bytes=4096))
    upstream.tokenizer.count(100)
    base = dumps(chat("", max_tokens=100000))
    pad = 4097 - len(base)
    body = dumps(chat("y" * pad, max_tokens=100000))
    assert len(body) == 4097
    assert_unchanged(p.post(body), "too_large", tokenize_calls=0)
    body = dumps(chat("y" * (pad - 1), max_tokens=100000))
    assert len(body) == 4096
    assert_rewritten(p.post(body), 100)


def test_large_body_within_limits_is_budgeted(proxy, upstream):
    """A 3 MiB body is over Envoy's 1 MiB default buffer: the shipped config raises it."""
    upstream.tokenizer.count(20000)
    body = chat("z" * (3 << 20) + nonce(), max_tokens=100000)
    res = proxy.post(body)
    assert res.status != 413, "Envoy's buffer limit was not raised (413)"
    assert_rewritten(res, 20000)


def test_body_over_default_max_body_bytes_passes(proxy, upstream):
    """Over the filter's default 8 MiB but under Envoy's 16 MiB limit: passes unchanged."""
    body = dumps(chat("q" * (9 << 20) + nonce(), max_tokens=100000))
    res = proxy.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "unchanged:too_large", res.describe()
    assert res.one.body == body and len(res.tokenize) == 0
    assert_content_length(res.one)
