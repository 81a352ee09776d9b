"""docs/spec.md §5: the exact count through vLLM's /tokenize: payload bytes, headers, contract."""

import json
from collections import OrderedDict

import pytest

from tests.e2e.common import (EXTRA_HEADER, MODEL, TOKENIZER_AUTHORITY, W, assert_rewritten,
                        assert_unchanged, cfg, chat, completion, dumps, nonce)
from tests.harness.spec import chat_payload_obj, completion_payload_obj, dumps_compact, estimates


def one_call(res):
    assert len(res.tokenize) == 1, res.describe()
    return res.tokenize[0]


def test_chat_payload_exact_bytes(proxy, upstream):
    n = nonce()
    # keys in the request deliberately spaced, escaped and interleaved with other members
    raw = ('{"model": "' + MODEL + '", "temperature": 0.7,\n "messages": [\n'
           '  {"role": "system", "content": "Be brief.", "name": "sys"},\n'
           '  {"role": "user", "content": "caf\\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001F600 '
           'tab\\tquote\\" ' + n + '"},\n'
           '  {"role": "assistant", "content": "ok", "reasoning_content": "thought"},\n'
           '  {"role": "user", "content": [{"type": "text", "text": "part"}]}\n ],\n'
           ' "tools": [{"type": "function", "function": {"name": "f", "parameters": '
           '{"type": "object", "properties": {"a": {"type": "integer"}}}}}],\n'
           ' "tool_choice": "auto", "stream": true, "max_tokens": 100000}')
    body = raw.encode("utf-8")
    upstream.tokenizer.count(321)
    res = proxy.post(body)
    assert_rewritten(res, 321)
    call = one_call(res)
    want = dumps_compact(chat_payload_obj(body))
    assert call.body == want, f"\n got  {call.body!r}\n want {want!r}"
    # spot checks of what the expected payload means
    p = json.loads(call.body)
    assert list(p) == ["model", "messages", "tools", "add_generation_prompt"]
    assert p["add_generation_prompt"] is True
    assert p["messages"][2] == {"role": "assistant", "content": "ok", "reasoning": "thought"}
    assert "caf\u00e9 \u00fcber \u65e5\u672c\u8a9e \U0001F600".encode() in call.body  # raw UTF-8
    assert call.method == "POST" and call.path == "/tokenize"


def test_chat_payload_tail_fields_in_order(proxy, upstream):
    req = OrderedDict([
        ("model", MODEL),
        ("messages", [{"role": "user", "content": "tail " + nonce()}]),
        ("tools", []),  # an explicit [] is kept
        ("add_generation_prompt", False),
        ("continue_final_message", True),
        ("add_special_tokens", False),
        ("chat_template", "{{ messages }}"),
        ("chat_template_kwargs", {"zeta": 1, "alpha": {"k": [1, 2]}}),
        ("media_io_kwargs", {"video": {"fps": 1}}),
        ("mm_processor_kwargs", {"max_pixels": 1000}),
        ("max_completion_tokens", 100000),
        ("echo", False),
    ])
    body = dumps(req)
    upstream.tokenizer.count(77)
    res = proxy.post(body)
    assert_rewritten(res, 77)
    want = dumps_compact(chat_payload_obj(body))
    assert one_call(res).body == want, f"\n got  {one_call(res).body!r}\n want {want!r}"


@pytest.mark.parametrize("effort,kwargs,thinking", [
    ("low", None, True),
    ("none", None, False),
    ("high", {"enable_thinking": False, "x": "y"}, False),  # already set: kept
    ("medium", {"x": 1}, True),
])
def test_reasoning_effort_folds_into_chat_template_kwargs(proxy, upstream, effort, kwargs, thinking):
    req = OrderedDict([("model", MODEL), ("reasoning_effort", effort),
                       ("messages", [{"role": "user", "content": "think " + nonce()}])])
    if kwargs is not None:
        req["chat_template_kwargs"] = kwargs
    req["max_tokens"] = 100000
    body = dumps(req)
    upstream.tokenizer.count(40)
    res = proxy.post(body)
    assert_rewritten(res, 40)
    got = json.loads(one_call(res).body, object_pairs_hook=OrderedDict)
    want = chat_payload_obj(body)
    assert list(got) == list(want)
    assert dict(got["chat_template_kwargs"]) == dict(want["chat_template_kwargs"])
    assert got["chat_template_kwargs"]["enable_thinking"] is thinking
    assert got["chat_template_kwargs"]["reasoning_effort"] == effort
    # keys given by the client keep their order at the front
    assert list(got["chat_template_kwargs"])[:len(kwargs or {})] == list(kwargs or {})
    # apart from the order of folded keys, the payload is exactly the expected bytes
    want["chat_template_kwargs"] = OrderedDict(
        (k, want["chat_template_kwargs"][k]) for k in got["chat_template_kwargs"])
    assert one_call(res).body == dumps_compact(want)
    assert "reasoning_effort" not in got


def test_documents_fold_into_chat_template_kwargs(proxy, upstream):
    docs = [{"title": "t", "text": "doc " + nonce()}]
    body = dumps(chat(documents=docs, max_tokens=100000))
    upstream.tokenizer.count(40)
    res = proxy.post(body)
    assert_rewritten(res, 40)
    got = json.loads(one_call(res).body)
    assert got["chat_template_kwargs"] == {"documents": docs}
    assert "documents" not in got
    assert one_call(res).body == dumps_compact(chat_payload_obj(body))


def test_completion_payload_exact_bytes(proxy, upstream):
    body = dumps(completion(prompt="Once upon a time \u00e9\u00e9 " + nonce(), max_tokens=100000,
                            add_special_tokens=True, echo=True, temperature=1))
    upstream.tokenizer.count(12)
    res = proxy.post(body, path="/v1/completions")
    assert_rewritten(res, 12)
    want = dumps_compact(completion_payload_obj(body))
    assert one_call(res).body == want


def test_tokenizer_request_headers(proxy, upstream):
    secret = "Bearer client-secret-" + nonce()
    upstream.tokenizer.count(10)
    res = proxy.post(chat(max_tokens=100000), headers={
        "authorization": secret, "cookie": "session=" + secret, "x-client-thing": secret,
        "user-agent": "client-agent/9"})
    assert_rewritten(res, 10)
    call = one_call(res)
    assert call.header("content-type") == "application/json"
    ua = call.header("user-agent") or ""
    assert "incontext" in ua.lower(), f"user-agent {ua!r} does not name incontext"
    assert any(ch.isdigit() for ch in ua), f"user-agent {ua!r} carries no version"
    assert call.header(EXTRA_HEADER[0]) == EXTRA_HEADER[1]
    assert call.header("host") == TOKENIZER_AUTHORITY
    assert call.header("authorization") is None, "client authorization forwarded to tokenizer"
    for k, v in call.headers:
        assert secret not in v, f"client header value leaked to tokenizer in {k}"
    # the upstream request itself keeps the client's authorization
    assert res.one.header("authorization") == secret


def test_configured_authorization_replaces_nothing_from_client(proxy_for, upstream):
    p = proxy_for(cfg(tokenizer={"headers": {"authorization": "Bearer tokenizer-key"}}))
    upstream.tokenizer.count(10)
    res = p.post(chat(max_tokens=100000), headers={"authorization": "Bearer client-key"})
    assert_rewritten(res, 10)
    assert one_call(res).header_all("authorization") == ["Bearer tokenizer-key"]
    assert res.one.header("authorization") == "Bearer client-key"


def test_tokenizer_path_and_cluster_config(proxy_for, upstream):
    upstream.tokenizer.count(10)
    p = proxy_for(cfg(tokenizer={"path": "/tokenize?via=cfg", "authority": "tok.internal"}))
    res = p.post(chat(max_tokens=100000))
    assert_rewritten(res, 10)
    call = one_call(res)
    assert call.path == "/tokenize?via=cfg" and call.header("host") == "tok.internal"


CONSTRAINED = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}}},
]


@pytest.mark.parametrize("extra", CONSTRAINED)
def test_constrained_requests_are_counted_exactly(proxy, upstream, extra):
    """docs/spec.md §5: structured output and a forced tool choice constrain decoding, not the
    rendered prompt: counted by the tokenizer like any request."""
    upstream.tokenizer.count(100)
    res = proxy.post(dumps(chat(max_tokens=100000, **extra)))
    assert_rewritten(res, 100)
    call = one_call(res)
    assert json.loads(call.body).get("tools") == extra.get("tools"), res.describe()


@pytest.mark.parametrize("extra", CONSTRAINED)
def test_estimate_constrained_switch_uses_estimate_without_tokenizer_call(proxy_for, upstream,
                                                                          extra):
    body = dumps(chat(max_tokens=100000, **extra))
    res = proxy_for(cfg(estimate_constrained=True)).post(body)
    assert len(res.tokenize) == 0, res.describe()
    ests = estimates(body)
    assert res.source == "estimate", res.describe()
    P = int(res.h("x-incontext-prompt-tokens"))
    assert P in ests, f"estimate {P} not in {ests}"
    assert_rewritten(res, P, exact=False)


@pytest.mark.parametrize("extra", [
    {"response_format": None},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": "auto"},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": None},
    {"tools": [], "tool_choice": "required"},
])
def test_mirrorable_prompts_use_tokenizer(proxy, upstream, extra):
    upstream.tokenizer.count(60)
    res = proxy.post(chat(max_tokens=100000, **extra))
    assert len(res.tokenize) == 1, res.describe()
    assert_rewritten(res, 60)


@pytest.mark.parametrize("count", [0, 1, W - 4096])
def test_count_edge_values(proxy, upstream, count):
    upstream.tokenizer.count(count)
    assert_rewritten(proxy.post(chat()), count)


def test_tokens_and_token_strs_ignored(proxy, upstream):
    upstream.tokenizer.always(("json", 200, {"tokens": [1, 2, 3], "token_strs": ["a"],
                                             "count": 3000, "max_model_len": 32768}))
    assert_rewritten(proxy.post(chat()), 3000)


def test_truncate_not_applied_with_non_text_content(proxy, upstream):
    upstream.tokenizer.count(3000)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look " + nonce()},
                                          {"type": "image_url", "image_url": {"url": "data:,x"}}]}]
    res = proxy.post({"model": MODEL, "messages": msgs, "truncate_prompt_tokens": 100})
    # T does not lower the count here; the C - T limit still applies
    assert_rewritten(res, 3000, T=100)
    assert res.h("x-incontext-prompt-tokens") == "3000"
