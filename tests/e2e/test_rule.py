"""docs/spec.md §2 (the rule) and the byte-preserving rewrite, through a real Envoy."""

import json

import pytest

from tests.e2e.common import (C, MAIN, MODEL, R, W, assert_content_length, assert_rewritten,
                        assert_unchanged, chat, completion, cfg, dumps, nonce)
from tests.harness.spec import CAP_FIELDS, decide


def test_remaining_equal_to_R_rewrites_to_R(proxy, upstream):
    upstream.tokenizer.count(W - R)
    res = proxy.post(chat())
    d = assert_rewritten(res, W - R)
    assert d.value == R and d.field == "max_tokens"
    assert len(res.tokenize) == 1


def test_remaining_R_minus_1_is_unchanged(proxy, upstream):
    upstream.tokenizer.count(W - R + 1)
    res = proxy.post(chat())
    assert not decide(json.loads(res.sent), W - R + 1, True, W=W, C=C, R=R, F=0).rewrite
    assert_unchanged(res, "insufficient", tokenize_calls=1)
    assert res.h("x-incontext-prompt-tokens") == str(W - R + 1)
    assert res.source == "exact"


@pytest.mark.parametrize("cap", [R + 1, 100000])
def test_boundary_with_larger_caller_cap(proxy, upstream, cap):
    upstream.tokenizer.count(W - R)
    res = proxy.post(chat(max_tokens=cap))
    assert assert_rewritten(res, W - R).value == R
    upstream.tokenizer.count(W - R + 1)
    res = proxy.post(chat(max_tokens=cap))
    assert_unchanged(res, "insufficient")


def test_no_cap_never_writes_below_R_for_exhausted_window(proxy, upstream):
    for P in (W - 1, W, W + 500):
        upstream.tokenizer.count(P)
        res = proxy.post(chat())
        assert_unchanged(res, "insufficient")
        assert "max_tokens" not in res.json_up()


def test_smaller_caller_cap_is_kept(proxy, upstream):
    upstream.tokenizer.count(1000)
    res = proxy.post(chat(max_tokens=100))
    d = assert_rewritten(res, 1000)
    assert d.value == 100 and d.required == 100


def test_smaller_caller_cap_is_the_required_minimum(proxy, upstream):
    # remaining == B: rewritten to B; remaining == B - 1: unchanged (not a smaller value)
    B = 100
    upstream.tokenizer.count(W - B)
    assert assert_rewritten(proxy.post(chat(max_tokens=B)), W - B).value == B
    upstream.tokenizer.count(W - B + 1)
    assert_unchanged(proxy.post(chat(max_tokens=B)), "insufficient")
    # below R but room for the small cap: still rewritten
    upstream.tokenizer.count(W - 150)
    assert assert_rewritten(proxy.post(chat(max_tokens=B)), W - 150).value == B


def test_big_cap_is_lowered_to_remaining(proxy, upstream):
    upstream.tokenizer.count(20000)
    d = assert_rewritten(proxy.post(chat(max_tokens=1_000_000)), 20000)
    assert d.value == W - 20000


def test_no_cap_chat_gets_remaining(proxy, upstream):
    upstream.tokenizer.count(5)
    d = assert_rewritten(proxy.post(chat()), 5)
    assert d.value == W - 5 and d.field == "max_tokens"


def test_several_caps_smallest_wins_and_keeps_its_name(proxy, upstream):
    upstream.tokenizer.count(1000)
    body = chat(max_tokens=9000, max_completion_tokens=500, max_output_tokens=700)
    res = proxy.post(body)
    d = assert_rewritten(res, 1000)
    got = res.json_up()
    assert d.field == "max_completion_tokens" and got["max_completion_tokens"] == 500
    assert "max_tokens" not in got and "max_output_tokens" not in got


@pytest.mark.parametrize("caps,field", [
    ({"max_tokens": 500, "max_completion_tokens": 500, "max_output_tokens": 500}, "max_tokens"),
    ({"max_completion_tokens": 500, "max_output_tokens": 500}, "max_completion_tokens"),
    ({"max_output_tokens": 400, "max_tokens": 500}, "max_tokens"),  # chat: output -> max_tokens
    ({"max_tokens": 9000, "max_output_tokens": 400, "max_completion_tokens": 9000}, "max_tokens"),
])
def test_cap_ties_and_names_chat(proxy, upstream, caps, field):
    upstream.tokenizer.count(1000)
    res = proxy.post(chat(**caps))
    d = assert_rewritten(res, 1000)
    assert d.field == field
    assert [k for k in res.json_up() if k in CAP_FIELDS] == [field]


@pytest.mark.parametrize("name", CAP_FIELDS)
def test_each_cap_field_name_chat(proxy, upstream, name):
    upstream.tokenizer.count(2000)
    res = proxy.post(chat(**{name: 100000}))
    d = assert_rewritten(res, 2000)
    want = "max_tokens" if name == "max_output_tokens" else name
    assert d.field == want
    assert [k for k in res.json_up() if k in CAP_FIELDS] == [want]
    assert res.json_up()[want] == W - 2000


@pytest.mark.parametrize("name", CAP_FIELDS)
def test_each_cap_field_name_completion(proxy, upstream, name):
    upstream.tokenizer.count(2000)
    res = proxy.post(completion(**{name: 100000}), path="/v1/completions")
    d = assert_rewritten(res, 2000)
    assert d.field == name  # completion keeps max_output_tokens
    assert [k for k in res.json_up() if k in CAP_FIELDS] == [name]


def test_completion_ties(proxy, upstream):
    upstream.tokenizer.count(10)
    res = proxy.post(completion(max_output_tokens=300, max_completion_tokens=300),
                     path="/v1/completions")
    assert assert_rewritten(res, 10).field == "max_completion_tokens"


def test_truncate_prompt_tokens_limit(proxy, upstream):
    # T lowers the count to min(count, T) and limits the output to C - T.
    T = 1000
    upstream.tokenizer.count(100)
    res = proxy.post(chat(truncate_prompt_tokens=T))
    d = assert_rewritten(res, 100, T=T)
    assert d.value == C - T
    upstream.tokenizer.count(5000)  # count above T: P = T
    res = proxy.post(chat(truncate_prompt_tokens=T))
    assert assert_rewritten(res, T, T=T).value == C - T


def test_rewrite_keeps_every_other_byte(proxy, upstream):
    """Odd spacing, escapes, exotic numbers, nested objects and unicode survive byte for byte."""
    n = nonce()
    raw = ('{ "model" :"' + MODEL + '",\n\t"temperature": 1.50, "top_p":1e-1 ,'
           '"messages":[ {"role":"user","content":"caf\\u00e9 \u65e5\u672c \\"q\\" \\/ ' + n + '"} ],'
           '\r\n "max_tokens" : 100000 , "stop" : ["\\n\\n", "END"],'
           ' "max_completion_tokens":"abc", "logit_bias": {"50256" : -100},'
           '"n":1, "seed":  -0, "stream" :false,"metadata":{"a":[1,2,{"b":null}]}}   ')
    body = raw.encode("utf-8")
    upstream.tokenizer.count(3000)
    res = proxy.post(body)
    d = assert_rewritten(res, 3000)
    assert d.field == "max_tokens" and d.value == W - 3000
    up = res.body_up
    # the untouched members keep their exact text
    for piece in ('"model" :"' + MODEL + '"', '"temperature": 1.50', '"top_p":1e-1',
                  '"stop" : ["\\n\\n", "END"]', '"logit_bias": {"50256" : -100}', '"seed":  -0',
                  '"stream" :false', '"metadata":{"a":[1,2,{"b":null}]}',
                  'caf\\u00e9 \u65e5\u672c \\"q\\" \\/ ' + n):
        assert piece.encode() in up, piece
    assert b'"abc"' not in up  # the invalid cap member is removed
    assert_content_length(res.one)


def test_unchanged_is_byte_identical_with_content_length(proxy, upstream):
    upstream.tokenizer.count(W)
    body = b'{"messages" : [ {"role":"user","content":"x ' + nonce().encode() + \
        b'"} ] , "model":"m",  "max_tokens": 100000 }\n'
    res = proxy.post(body)
    assert_unchanged(res, "insufficient")
    assert_content_length(res.one)
