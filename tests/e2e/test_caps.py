"""docs/spec.md §3: caller caps are read with vLLM's lax integer parsing."""

import json

import pytest

from tests.e2e.common import W, assert_rewritten, chat, nonce
from tests.harness.spec import CAP_FIELDS, parse_cap

P = 1000


def raw_chat(cap_json: str, field: str = "max_tokens") -> bytes:
    return ('{"model":"m","messages":[{"role":"user","content":"caps ' + nonce() + '"}],"'
            + field + '":' + cap_json + ',"temperature":0}').encode()


@pytest.mark.parametrize("cap_json,want", [
    ('"5"', 5), ('"5.0"', 5), ('5.0', 5), ('"1_0"', 10), ('true', 1), ('" 7 "', 7),
    ('"+8"', 8), ('"1_000"', 1000), ('"12.000"', 12), ('300', 300), ('4096.0', 4096),
])
def test_lax_valid_caps(proxy, upstream, cap_json, want):
    assert parse_cap(json.loads(cap_json)) == want  # the test's own reading of docs/spec.md §3
    upstream.tokenizer.count(P)
    res = proxy.post(raw_chat(cap_json))
    d = assert_rewritten(res, P)
    assert d.value == want
    assert res.json_up()["max_tokens"] == want
    assert f'"max_tokens":{want}'.replace(" ", "").encode() in res.body_up.replace(b" ", b"")


@pytest.mark.parametrize("cap_json", [
    "false", "0", "-3", "null", "1.5", '"abc"', '"1__0"', '"5.5"', '"0x10"', '"_1"', '"1_"',
    "[]", "[5]", "{}", '{"v":5}', '""', '"0"', '"-4"', "-0.0", '"1e3"',
])
def test_invalid_caps_are_ignored_and_removed(proxy, upstream, cap_json):
    assert parse_cap(json.loads(cap_json)) is None
    upstream.tokenizer.count(P)
    res = proxy.post(raw_chat(cap_json))
    d = assert_rewritten(res, P)
    assert d.value == W - P and d.field == "max_tokens"


def test_invalid_cap_next_to_valid_one(proxy, upstream):
    upstream.tokenizer.count(P)
    body = chat(max_tokens="lots", max_completion_tokens=50, max_output_tokens=0)
    res = proxy.post(body)
    d = assert_rewritten(res, P)
    assert d.field == "max_completion_tokens" and d.value == 50
    assert [k for k in res.json_up() if k in CAP_FIELDS] == ["max_completion_tokens"]


@pytest.mark.parametrize("cap_json", ["100000000000000000000000000000", "1e300",
                                      '"99999999999999999999999999"', "18446744073709551616"])
def test_huge_caps_saturate(proxy, upstream, cap_json):
    upstream.tokenizer.count(P)
    res = proxy.post(raw_chat(cap_json))
    d = assert_rewritten(res, P)
    assert d.value == W - P


def test_lax_cap_in_each_field(proxy, upstream):
    for field in CAP_FIELDS:
        upstream.tokenizer.count(P)
        res = proxy.post(raw_chat('"64"', field))
        d = assert_rewritten(res, P)
        assert d.value == 64
        assert d.field == ("max_tokens" if field == "max_output_tokens" else field)
