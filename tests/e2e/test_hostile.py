"""Hostile input and tokenizer faults, end to end.

Every case has one defined outcome, asserted exactly: the x-incontext-* headers, the bytes the
upstream got, the tokenizer calls and the change of every filter counter. After each case Envoy
must still serve a normal request (rewritten from an exact count) and no wasm VM may have
failed or been replaced (Envoy's wasm stats; the module has none). The last test checks the
counter identities over the whole run of this module's Envoy (a fresh one per build, used by
this module only).

Envoy here: the shipped config with max_body_bytes 64 KiB (so "too large" is cheap to reach),
tokenizer timeout 3 s, Envoy's own buffer limits 16 MiB (shipped).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from typing import Callable, Dict, List, Tuple

import httpx
import pytest

from tests.e2e.common import (C, F, MODEL, R, W, Proxy, Result, assert_content_length,
                        assert_rewritten, assert_unchanged, cfg, chat, dumps, h2_post, nonce)
from tests.harness.envoy import Envoy, no_filter
from tests.harness.spec import (CAP_FIELDS, chat_payload_obj, decide, dumps_compact, estimate, estimates,
                      non_cap_members_kept, top_level_members)
from tests.harness.upstream import ok

LIMIT = 65536                 # max_body_bytes of this module's Envoy
TOK_TIMEOUT_MS = 3000
# The cache evicts only from a full set of 16 entries: the 20 prompts a test abandons and then
# asks again do not evict each other, and at 2^20 entries (65,536 sets) the other tests'
# prompts on this Envoy are far too few to fill their sets.
HOSTILE = cfg(max_body_bytes=LIMIT, tokenizer={"timeout_ms": TOK_TIMEOUT_MS}, cache_entries=1 << 20)
ENVOY_BUFFER_LIMIT = 16 << 20  # per_connection_buffer_limit_bytes / buffer filter (shipped)
PROBE_COUNT = 321

# Requests of this module whose outcome is, by design, not one of rewritten / unchanged /
# rejected (the client went away first), and requests estimated without a tokenizer call
# although they missed the cache (the tokenize payload cannot be built); for the build under
# test (set to zero with its Envoy).
LEDGER = {"abandoned": 0, "no_payload": 0}


# --- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def henv(envoy_bin, glue, upstream, envoys):
    """A fresh Envoy for this module only (its counters start at zero)."""
    env = Envoy(envoy_bin, envoys.workdir, HOSTILE, (upstream.host, upstream.port),
                remove_filter=no_filter(), name=f"envoy-hostile-{glue}", glue=glue)
    LEDGER.update(abandoned=0, no_payload=0)
    env.start()
    env.baseline = env.wasm_stats()
    yield env
    env.stop()


@pytest.fixture
def hp(henv, upstream):
    p = Proxy(henv, upstream)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def _still_serving(request, upstream):
    """After every case: Envoy still answers a normal request exactly, no VM failed."""
    yield
    if "henv" not in request.fixturenames:
        return
    env = request.getfixturevalue("henv")
    assert env.alive(), "Envoy exited:\n" + env.log_tail()
    upstream.tokenizer.reset()
    upstream.tokenizer.count(PROBE_COUNT)
    p = Proxy(env, upstream)
    try:
        res = p.post(chat(max_tokens=100000))
    finally:
        p.close()
    assert_rewritten(res, PROBE_COUNT)
    assert res.delta == {"incontext_requests": 1, "incontext_cache_misses": 1,
                         "incontext_tokenizer_calls": 1, "incontext_count_calls": 1, "incontext_rewritten": 1}, res.delta
    assert not env.vm_failures(env.baseline), env.vm_failures(env.baseline)


# --- helpers -------------------------------------------------------------------------------
def observe(p: Proxy, sent: bytes, do: Callable[[], httpx.Response]) -> Result:
    """Runs ``do`` (which sends one request somehow) and collects what the upstream, the
    tokenizer and the counters saw, like Proxy.send."""
    before_up = len(p.upstream.snapshot())
    before_tok = len(p.upstream.tokenizer.snapshot())
    before = p.envoy.counters()
    resp = do()
    after = p.envoy.counters()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return Result(resp, sent, p.upstream.snapshot()[before_up:],
                  p.upstream.tokenizer.snapshot()[before_tok:], delta)


def wait_counters(env: Envoy, before: Dict[str, int], want: Dict[str, int],
                  timeout=10.0) -> Dict[str, int]:
    """The counter delta once it equals ``want`` (or whatever it is after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        now = env.counters()
        delta = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
        if delta == want or time.monotonic() > deadline:
            return delta
        time.sleep(0.1)


def sized_chat(size: int, **caps) -> bytes:
    """A chat body of exactly ``size`` bytes (the user message is padded)."""
    tag = nonce()
    base = dumps(chat(tag, **caps))
    pad = size - len(base)
    assert pad >= 0
    body = dumps(chat(tag + "y" * pad, **caps))
    assert len(body) == size
    return body


def raw_http(port: int, data: bytes, timeout=30.0) -> httpx.Response:
    """Sends raw bytes on a new connection and reads one HTTP/1.1 answer (content-length
    framed, as Envoy sends them here)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before the answer: {buf[:200]!r}")
            buf += chunk
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", 0))
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return httpx.Response(status, headers=headers, content=body)


def chunked_request(body: bytes, sizes: List[int], trailers: bytes = b"",
                    path="/v1/chat/completions") -> bytes:
    out = [b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"transfer-encoding: chunked\r\n\r\n" % path.encode()]
    i = 0
    k = 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        k += 1
        piece = body[i:i + n]
        i += n
        out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
    out.append(b"0\r\n" + trailers + b"\r\n")
    return b"".join(out)


def cap_members(body: bytes) -> List[Tuple[str, object]]:
    """Top-level cap members of a JSON body, duplicates included, in order."""
    pairs = json.loads(body, object_pairs_hook=lambda kv: kv)
    return [(k, v) for k, v in pairs if k in CAP_FIELDS]


def assert_rewritten_deep(res: Result, P: int, exact: bool, caps: dict):
    """assert_rewritten for bodies Python's json cannot load (nesting beyond its recursion
    limit): the caps are given, the rest is checked on the raw member spans."""
    d = decide({"messages": [], **caps}, P, exact, W=W, C=C, R=R, F=F)
    assert d.rewrite
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == ("exact" if exact else "estimate"), res.describe()
    assert res.h("x-incontext-prompt-tokens") == str(P), res.describe()
    assert res.h("x-incontext-max-tokens") == str(d.value), res.describe()
    up = res.body_up
    members = top_level_members(up)
    caps_up = [k for k in members if k in CAP_FIELDS]
    assert caps_up == [d.field], caps_up
    (_, _), (vs, ve) = members[d.field]
    assert up[vs:ve].decode() == str(d.value)
    assert up.count(b'"max_tokens"') == 1
    problems = non_cap_members_kept(res.sent, up)
    assert not problems, problems
    assert_content_length(res.one)


# exact counter deltas of the common outcomes
def d_unchanged(reason):
    return {"incontext_requests": 1, f"incontext_unchanged_{reason}": 1}


D_EXACT = {"incontext_requests": 1, "incontext_cache_misses": 1, "incontext_tokenizer_calls": 1, "incontext_count_calls": 1,
           "incontext_rewritten": 1}


def d_failed(kind):
    return {"incontext_requests": 1, "incontext_cache_misses": 1,
            "incontext_tokenizer_calls": 1, "incontext_count_calls": 1, f"incontext_tokenizer_failures_{kind}": 1,
            "incontext_estimates": 1, "incontext_rewritten": 1}


D_NO_PAYLOAD = {"incontext_requests": 1, "incontext_cache_misses": 1, "incontext_estimates": 1,
                "incontext_rewritten": 1}


# --- bodies beyond max_body_bytes -----------------------------------------------------------
def test_body_over_limit_with_content_length_passes_unchanged(hp, upstream):
    body = sized_chat(LIMIT + 1, max_tokens=100000)
    res = hp.post(body)
    assert_unchanged(res, "too_large", tokenize_calls=0)
    assert res.delta == d_unchanged("too_large")


def test_body_at_limit_with_content_length_is_budgeted(hp, upstream):
    upstream.tokenizer.count(1000)
    res = hp.post(sized_chat(LIMIT, max_tokens=100000))
    assert_rewritten(res, 1000)
    assert res.delta == D_EXACT


@pytest.mark.parametrize("size,chunk", [(LIMIT + 1, 8192), (4 * LIMIT, 65536), (LIMIT + 1, 1000)])
def test_chunked_body_over_limit_passes_unchanged(hp, upstream, size, chunk):
    body = sized_chat(size, max_tokens=100000)
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)]
    res = observe(hp, body, lambda: hp.client.post(
        "/v1/chat/completions", content=iter(pieces), headers={"content-type": "application/json"}))
    assert "content-length" not in res.response.request.headers  # really chunked
    assert_unchanged(res, "too_large", tokenize_calls=0)
    assert res.delta == d_unchanged("too_large")


def test_chunked_body_at_limit_is_budgeted(hp, upstream):
    upstream.tokenizer.count(1000)
    body = sized_chat(LIMIT, max_tokens=100000)
    pieces = [body[i:i + 4096] for i in range(0, len(body), 4096)]
    res = observe(hp, body, lambda: hp.client.post(
        "/v1/chat/completions", content=iter(pieces), headers={"content-type": "application/json"}))
    assert_rewritten(res, 1000)
    assert res.delta == D_EXACT


def test_chunked_body_over_envoy_buffer_limit_is_413_from_envoy(hp, upstream):
    """Beyond Envoy's own buffer limit (16 MiB in the shipped config) Envoy answers 413 itself
    (docs/spec.md §4): the wasm layout's buffer filter, or the module, which holds a request it
    held the head of to its end; the filter had already let the request go (too_large)."""
    too_large_is_413(hp, "chunked")


@pytest.mark.glues("wasm")   # the buffer filter holds every body (tests/e2e/README.md)
def test_body_over_envoy_buffer_limit_with_content_length_is_413_from_envoy(hp, upstream):
    """With a Content-Length over max_body_bytes the head goes on at once: the wasm layout's
    buffer filter still holds the body, and answers 413 past its limit."""
    too_large_is_413(hp, "content-length")


def too_large_is_413(hp, framing):
    body = b'{"model": "m", "messages": [], "pad": "' + b"z" * (ENVOY_BUFFER_LIMIT + 1024) + b'"}'
    content = body if framing == "content-length" else iter(
        [body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)])
    res = observe(hp, body, lambda: hp.client.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}))
    assert res.status == 413, res.describe()
    assert res.action == "unchanged:too_large", res.describe()
    assert res.upstream == [] and res.tokenize == []
    assert res.delta == d_unchanged("too_large")


# --- JSON nested 10 000 levels --------------------------------------------------------------
DEEP_ARRAY = "[" * 10000 + "]" * 10000
DEEP_OBJECT = '{"a":' * 10000 + "1" + "}" * 10000


@pytest.mark.parametrize("deep", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_nested_10000_inside_messages_is_counted_by_the_tokenizer(hp, upstream, deep):
    """The payload is built from the raw message text (a compact copy, no DOM), so depth is no
    limit: the tokenizer gets the deep message, compacted, and its count is used."""
    upstream.tokenizer.count(2000)
    n = nonce()
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "deep %s", "x": %s}], '
            '"max_tokens": 100000}' % (MODEL, n, deep)).encode()
    res = hp.post(body)
    assert len(res.tokenize) == 1
    want = ('{"model":"%s","messages":[{"role":"user","content":"deep %s","x":%s}],'
            '"add_generation_prompt":true}' % (MODEL, n, deep)).encode()
    assert res.tokenize[0].body == want
    assert_rewritten_deep(res, 2000, True, {"max_tokens": 100000})
    assert res.delta == D_EXACT


@pytest.mark.parametrize("deep", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
def test_nested_10000_in_another_member_is_kept_byte_identical(hp, upstream, deep):
    """A member the tokenizer never sees (here `metadata`) is skipped, not parsed: exact count,
    and the deep member reaches the upstream byte for byte."""
    upstream.tokenizer.count(2000)
    n = nonce()
    twin = ('{"model": "%s", "messages": [{"role": "user", "content": "meta %s"}], '
            '"max_tokens": 100000}' % (MODEL, n)).encode()
    body = twin[:-1] + b', "metadata": ' + deep.encode() + b"}"
    res = hp.post(body)
    assert len(res.tokenize) == 1
    assert res.tokenize[0].body == dumps_compact(chat_payload_obj(twin))
    assert_rewritten_deep(res, 2000, True, {"max_tokens": 100000})
    assert res.delta == D_EXACT


@pytest.mark.parametrize("member,depth", [("tools", 10000), ("tools", 130),
                                          ("chat_template_kwargs", 130)])
def test_deep_payload_member_is_not_left_out_of_the_count(hp, upstream, member, depth):
    """`tools` and `chat_template_kwargs` are part of the tokenize payload (docs/spec.md §5). When one
    is too deep for the filter to re-serialise (serde_json stops at 128 levels; Python's json,
    and so vLLM, reads ~1000), the count must not silently leave it out: either the payload
    carries it, or the request is estimated (as for deep `messages`)."""
    upstream.tokenizer.count(2000)
    deep = "[" * depth + "]" * depth
    value = ('[{"type": "function", "function": {"name": "f", "parameters": %s}}]' % deep
             if member == "tools" else '{"x": %s}' % deep)
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "deep %s"}], '
            '"%s": %s, "max_tokens": 100000}' % (MODEL, nonce(), member, value)).encode()
    res = hp.post(body)
    if res.tokenize:
        assert b'"%s"' % member.encode() in res.tokenize[0].body, (
            f"FILTER BUG: the tokenize payload left out `{member}` (nested {depth} levels), so "
            f"the 'exact' count ignores it: {res.describe()}; payload "
            f"{res.tokenize[0].body[:200]!r}")
        assert res.delta == D_EXACT
    else:
        P = int(res.h("x-incontext-prompt-tokens") or 0)
        assert P in estimates(body), (P, estimates(body))
        assert_rewritten_deep(res, P, False, {"max_tokens": 100000})
        assert res.delta == D_NO_PAYLOAD
        LEDGER["no_payload"] += 1


# --- duplicate keys ------------------------------------------------------------------------
MSG = '"model": "%s", "messages": [{"role": "user", "content": "dup %s"}]'


@pytest.mark.parametrize("caps_before,caps_after,field,value", [
    ('"max_tokens": 10', '"max_tokens": 100000', "max_tokens", W - 100),
    ('"max_tokens": 100000', '"max_tokens": 50', "max_tokens", 50),
    ('"max_tokens": 100', '"max_tokens": "abc"', "max_tokens", W - 100),
    ('"max_tokens": 100, "max_tokens": 200', '"max_tokens": 300', "max_tokens", 300),
    ('"max_completion_tokens": 5000, "max_tokens": 9000', '"max_completion_tokens": 100000',
     "max_tokens", 9000),
    ('"max_output_tokens": 7000', '"max_output_tokens": null, "max_tokens": 0', "max_tokens",
     W - 100),
], ids=["small_then_large", "large_then_small", "valid_then_invalid", "three",
        "across_fields", "all_invalid_last"])
def test_duplicate_caps_last_one_counts_and_all_are_removed(hp, upstream, caps_before,
                                                             caps_after, field, value):
    """As Python's json (and so vLLM) reads it, the last duplicate counts; on rewrite every cap
    member goes and exactly one is written."""
    upstream.tokenizer.count(100)
    body = ("{" + caps_before + ", " + MSG % (MODEL, nonce()) + ", " + caps_after + "}").encode()
    res = hp.post(body)
    d = assert_rewritten(res, 100)
    assert (d.field, d.value) == (field, value)
    assert cap_members(res.body_up) == [(field, value)], res.body_up
    assert res.delta == D_EXACT


def test_duplicate_messages_last_one_is_counted(hp, upstream):
    upstream.tokenizer.count(100)
    n = nonce()
    body = ('{"messages": [{"role": "user", "content": "first %s"}], "model": "%s", '
            '"messages": [{"role": "user", "content": "second %s"}], "max_tokens": 100000}'
            % (n, MODEL, n)).encode()
    res = hp.post(body)
    assert_rewritten(res, 100)
    assert len(res.tokenize) == 1
    assert res.tokenize[0].body == dumps_compact(chat_payload_obj(body))
    assert b"second" in res.tokenize[0].body and b"first" not in res.tokenize[0].body
    assert res.body_up.count(b'"messages"') == 2  # both kept, byte for byte


# --- huge numbers ----------------------------------------------------------------------------
@pytest.mark.parametrize("cap,expected_value", [
    ("1e400", W - 100),                        # infinity for Python: invalid, removed
    ("-1e400", W - 100),                       # invalid
    ("1E+400", W - 100),
    ("18446744073709551616", W - 100),         # 2**64: valid, saturates
    ("99999999999999999999999999999999999999", W - 100),
    ('"18446744073709551616"', W - 100),       # lax string form, saturates
    ("1e20", W - 100),                         # integral float beyond u64: saturates
    ("1e3", 1000),                             # integral float
    ("4096.000", 4096),
    ("0.5e1", 5),
    ("1.0000000000000000001", 1),              # exactly 1.0 as a double: a cap of 1
], ids=lambda x: str(x))
def test_huge_and_odd_numbers_as_caps(hp, upstream, cap, expected_value):
    upstream.tokenizer.count(100)
    body = ("{" + MSG % (MODEL, nonce()) + ', "temperature": 1e400, "max_tokens": ' + cap
            + "}").encode()
    obj = json.loads(body)
    res = hp.post(body)
    d = assert_rewritten(res, 100)
    assert d.value == expected_value, (d, obj["max_tokens"])
    assert cap_members(res.body_up) == [("max_tokens", expected_value)]
    assert b'"temperature": 1e400' in res.body_up  # other numbers untouched
    assert res.delta == D_EXACT


@pytest.mark.parametrize("cap,outcome", [
    ("1e400", "unchanged:no_cap"),             # completion without a valid cap
    ("18446744073709551616", "rewritten"),
])
def test_huge_numbers_as_completion_caps(hp, upstream, cap, outcome):
    upstream.tokenizer.count(100)
    body = ('{"model": "%s", "prompt": "story %s", "max_tokens": %s}'
            % (MODEL, nonce(), cap)).encode()
    res = hp.post(body, path="/v1/completions")
    if outcome == "rewritten":
        assert_rewritten(res, 100)
        assert res.delta == D_EXACT
    else:
        assert_unchanged(res, "no_cap", tokenize_calls=0)
        assert res.delta == d_unchanged("no_cap")


# --- invalid UTF-8 -----------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "bad \xff\xfe byte"}], '
    b'"max_tokens": 100000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "ok"}], "\xc3": 1, '
    b'"max_tokens": 100000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "overlong \xc0\xaf"}], '
    b'"max_tokens": 100000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "surrogate \xed\xa0\x80"}], '
    b'"max_tokens": 100000}',
    b'{"model": "m", "messages": [{"role": "user", "content": "cut \xe4\xbd"}], '
    b'"max_tokens": 100000}',
    b'\xef\xbb\xbf{"model": "m", "messages": [], "max_tokens": 100000}',
    b'\xff\xfe{\x00}\x00',
], ids=["in_string", "in_key", "overlong", "utf8_surrogate", "truncated_sequence", "bom",
        "utf16"])
def test_invalid_utf8_passes_unchanged(hp, upstream, raw):
    res = hp.post(raw)
    assert_unchanged(res, "not_json", tokenize_calls=0)
    assert res.delta == d_unchanged("not_json")


def test_lone_surrogate_escape_is_estimated(hp, upstream):
    """`\\ud800` is valid JSON text (Python reads it) but no valid string for the tokenize
    payload: the estimate is used, without a call."""
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "lone \\ud800 %s"}], '
            '"max_tokens": 100000}' % (MODEL, nonce())).encode()
    res = hp.post(body)
    assert res.tokenize == []
    assert_rewritten(res, estimate(body), exact=False)
    assert res.delta == D_NO_PAYLOAD
    LEDGER["no_payload"] += 1


# --- content-encoding -----------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["gzip", "GZIP", "br", "deflate", "gzip, identity"])
def test_content_encoding_passes_unchanged(hp, upstream, encoding):
    body = gzip.compress(dumps(chat(max_tokens=100000)))
    res = hp.post(body, headers={"content-encoding": encoding})
    assert_unchanged(res, "encoding", tokenize_calls=0)
    assert res.one.header("content-encoding") == encoding
    assert res.delta == d_unchanged("encoding")


def test_identity_encoding_is_budgeted(hp, upstream):
    upstream.tokenizer.count(100)
    res = hp.post(chat(max_tokens=100000), headers={"content-encoding": "identity"})
    assert_rewritten(res, 100)
    assert res.delta == D_EXACT


# --- HTTP/2 (h2c) and chunked HTTP/1.1 clients ------------------------------------------------
@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "no-content-length"])
def test_http2_client(hp, henv, upstream, streamed):
    upstream.tokenizer.count(700)
    body = dumps(chat(max_tokens=100000))
    with httpx.Client(base_url=henv.url, http1=False, http2=True, timeout=60) as h2:
        content = iter([body[:10], body[10:]]) if streamed else body
        res = observe(hp, body, lambda: h2.post("/v1/chat/completions", content=content,
                                                headers={"content-type": "application/json"}))
    assert res.response.http_version == "HTTP/2"
    assert_rewritten(res, 700)
    assert res.delta == D_EXACT


def test_http2_client_over_limit(hp, henv, upstream):
    body = sized_chat(LIMIT + 10, max_tokens=100000)
    with httpx.Client(base_url=henv.url, http1=False, http2=True, timeout=60) as h2:
        res = observe(hp, body, lambda: h2.post("/v1/chat/completions", content=iter(
            [body[:30000], body[30000:]]), headers={"content-type": "application/json"}))
    assert res.response.http_version == "HTTP/2"
    assert_unchanged(res, "too_large", tokenize_calls=0)
    assert res.delta == d_unchanged("too_large")


@pytest.mark.parametrize("sizes", [[1], [7, 1, 300], [1 << 16]], ids=["1-byte", "mixed", "one"])
def test_chunked_http11_client(hp, henv, upstream, sizes):
    upstream.tokenizer.count(900)
    body = dumps(chat(max_tokens=100000))
    res = observe(hp, body, lambda: raw_http(henv.port, chunked_request(body, sizes)))
    assert_rewritten(res, 900)
    assert res.delta == D_EXACT


def test_chunked_http11_client_with_trailers(hp, henv, upstream):
    """Envoy drops HTTP/1.1 request trailers unless told otherwise, so the body simply ends:
    budgeted as usual."""
    upstream.tokenizer.count(900)
    body = dumps(chat(max_tokens=100000))
    res = observe(hp, body, lambda: raw_http(
        henv.port, chunked_request(body, [100], trailers=b"x-trailer: 1\r\n")))
    assert_rewritten(res, 900)
    assert res.delta == D_EXACT


def h2_request_with_trailers(port: int, body: bytes, trailers) -> httpx.Response:
    """One HTTP/2 (h2c, prior knowledge) POST whose body ends with trailers."""
    a = h2_post(port, "/v1/chat/completions", body, trailers=trailers)
    return httpx.Response(a.status, headers=a.headers, content=a.body)


def test_http2_client_with_request_trailers_passes_unchanged(hp, henv, upstream):
    """Over HTTP/2 the trailers reach the filter before the body has ended: the request passes
    unchanged (not_json, docs/spec.md §4), its body byte for byte."""
    body = dumps(chat(max_tokens=100000))
    res = observe(hp, body, lambda: h2_request_with_trailers(henv.port, body, [("x-t", "1")]))
    assert_unchanged(res, "not_json", tokenize_calls=0)
    assert res.delta == d_unchanged("not_json")


# --- clients that go away -------------------------------------------------------------------
def _wait_tokenizer_calls(upstream, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(upstream.tokenizer.snapshot()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(upstream.tokenizer.snapshot())


def _wait_late_answers(env, gate, completed_before, n, timeout=10.0):
    """How many of ``n`` held tokenizer answers Envoy has received and the filter has taken,
    once all of them have been written: the tokenizer cluster's completed requests, then no
    orphan left. Wasm: the gauge falls as each worker's filter stores an answer, which can
    come a little after the cluster counted the reply. Module: the calls made again after
    their streams are the configuration's, answered on Envoy's main thread in the event that
    counts the reply, the thread that serves the admin page too (it has no such gauge)."""
    if gate.wait_answered(n, timeout) < n:
        return gate.answered
    deadline = time.monotonic() + timeout
    while True:
        got = env.cluster_stat("vllm", "upstream_rq_completed") - completed_before
        if got >= n and env.gauges().get("incontext_orphans", 0 if env.glue == "module" else None) == 0:
            return got
        if time.monotonic() > deadline:
            return got if got < n else -1
        time.sleep(0.02)


@pytest.mark.parametrize("clients", [1, 20])
def test_client_disconnects_while_tokenizer_call_in_flight(hp, henv, upstream, clients):
    """The request is abandoned: nothing reaches the upstream, no outcome is counted (only
    requests, the cache miss and the call), and Envoy keeps serving. The call belongs to the
    plugin, not the stream, so its late answer is still cached (docs/spec.md §6)."""
    gate = upstream.tokenizer.held(ok(100))
    before = henv.counters()
    answered = henv.cluster_stat("vllm", "upstream_rq_completed")
    tag = nonce()
    bodies = [dumps(chat(f"gone {tag} {i}", max_tokens=100000)) for i in range(clients)]
    socks = []
    for b in bodies:
        s = socket.create_connection(("127.0.0.1", henv.port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                  b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(b), b))
        socks.append(s)
    assert _wait_tokenizer_calls(upstream, clients) == clients
    for s in socks:
        s.close()
    want = {"incontext_requests": clients, "incontext_cache_misses": clients,
            "incontext_tokenizer_calls": clients, "incontext_count_calls": clients}
    assert wait_counters(henv, before, want) == want
    gate.open()   # the late answers, once every client has gone
    assert _wait_late_answers(henv, gate, answered, clients) == clients
    assert henv.counters() == {**before, **{k: before.get(k, 0) + v for k, v in want.items()}}
    assert upstream.find(tag.encode()) == []
    LEDGER["abandoned"] += clients
    # every abandoned prompt again is a cache hit: the late answers were stored
    upstream.tokenizer.count(7)   # would show if the tokenizer were asked again
    for b in bodies:
        res = hp.post(b)
        assert_rewritten(res, 100, source="cache")
        assert res.delta == {"incontext_requests": 1, "incontext_cache_hits": 1,
                             "incontext_rewritten": 1}, res.describe()


def test_http2_stream_reset_while_tokenizer_call_in_flight(hp, henv, upstream):
    gate = upstream.tokenizer.held(ok(100))
    before = henv.counters()
    answered = henv.cluster_stat("vllm", "upstream_rq_completed")
    tag = nonce()
    body = dumps(chat(f"h2 gone {tag}", max_tokens=100000))

    async def go():
        async with httpx.AsyncClient(base_url=henv.url, http1=False, http2=True) as h2:
            task = asyncio.create_task(h2.post("/v1/chat/completions", content=body,
                                               headers={"content-type": "application/json"}))
            for _ in range(200):
                if upstream.tokenizer.snapshot():
                    break
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    asyncio.run(go())
    want = {"incontext_requests": 1, "incontext_cache_misses": 1, "incontext_tokenizer_calls": 1, "incontext_count_calls": 1}
    assert wait_counters(henv, before, want) == want
    gate.open()
    assert _wait_late_answers(henv, gate, answered, 1) == 1
    assert wait_counters(henv, before, want, timeout=0) == want
    assert upstream.find(tag.encode()) == []
    LEDGER["abandoned"] += 1


def test_client_disconnects_mid_body(hp, henv, upstream):
    before = henv.counters()
    body = dumps(chat(f"half {nonce()}", max_tokens=100000))
    with socket.create_connection(("127.0.0.1", henv.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                  b"application/json\r\ncontent-length: %d\r\n\r\n%s"
                  % (len(body), body[:len(body) // 2]))
        time.sleep(0.3)
    want = {"incontext_requests": 1}
    assert wait_counters(henv, before, want) == want
    time.sleep(0.5)
    assert wait_counters(henv, before, want, timeout=0) == want
    assert upstream.tokenizer.snapshot() == []
    LEDGER["abandoned"] += 1


# --- tokenizer answers that are too big, or never come ------------------------------------------
def _big_answer(size: int):
    return ("raw", 200, b'{"count": 5, "max_model_len": 32768, "pad": "' + b"p" * size + b'"}',
            "application/json")


@pytest.mark.parametrize("size,kind", [
    ((1 << 20) + 1, "contract"),   # over the filter's 1 MiB read limit: not read
    (2 << 20, "contract"),
    (50 << 20, "transport"),       # over Envoy's http.async_response_buffer_limit (32 MiB)
], ids=["1MiB+1", "2MiB", "50MB"])
def test_tokenizer_answers_too_much(hp, upstream, size, kind):
    upstream.tokenizer.always(_big_answer(size))
    res = hp.post(chat(max_tokens=100000))
    assert len(res.tokenize) == 1
    assert_rewritten(res, estimate(res.sent), exact=False)
    assert res.delta == d_failed(kind)


def test_tokenizer_answer_just_under_read_limit_is_used(hp, upstream):
    body = b'{"count": 5, "max_model_len": 32768, "pad": "'
    body += b"p" * ((1 << 20) - len(body) - 2) + b'"}'
    assert len(body) == 1 << 20
    upstream.tokenizer.always(("raw", 200, body, "application/json"))
    res = hp.post(chat(max_tokens=100000))
    assert_rewritten(res, 5)
    assert res.delta == D_EXACT


def test_tokenizer_never_answers(hp, upstream):
    upstream.tokenizer.held(ok(5))   # opened only when the upstream is reset after the test
    t = time.monotonic()
    res = hp.post(chat(max_tokens=100000))
    elapsed = time.monotonic() - t
    assert TOK_TIMEOUT_MS / 1000 - 0.1 <= elapsed < TOK_TIMEOUT_MS / 1000 + 5, elapsed
    assert_rewritten(res, estimate(res.sent), exact=False)
    assert res.delta == d_failed("timeout")


# --- the whole run ----------------------------------------------------------------------------
BAD_LOG = ("panicked", "Wasm VM failed", "[critical]", "restricted_callback", "Uncaught",
           "Function: proxy_on_")


@pytest.mark.last("module")
def test_counters_consistent_and_no_vm_failure(henv):
    """Over everything this module sent to its fresh Envoy (cases and probes); marked to run
    after the module's other tests."""
    c = henv.counters()
    unchanged = sum(v for k, v in c.items() if k.startswith("incontext_unchanged_"))
    failures = sum(v for k, v in c.items() if k.startswith("incontext_tokenizer_failures_"))
    assert c["incontext_requests"] > 0
    decided = c["incontext_rewritten"] + unchanged + c["incontext_rejected"]
    assert c["incontext_requests"] == decided + LEDGER["abandoned"], (c, LEDGER)
    assert c["incontext_tokenizer_calls"] == c["incontext_cache_misses"] - LEDGER["no_payload"], (
        c, LEDGER)
    # every call of this module is a count on the request's path (no window lookup, no skip)
    assert c["incontext_count_calls"] == c["incontext_tokenizer_calls"], c
    assert c["incontext_estimates"] == failures + LEDGER["no_payload"], (c, LEDGER)
    assert c["incontext_unchanged_internal"] == 0 and c["incontext_rejected"] == 0, c
    assert c["incontext_tokenizer_failures_dispatch"] == 0, c
    assert not henv.vm_failures(henv.baseline), henv.vm_failures(henv.baseline)
    bad = [line for line in henv.log_text().splitlines() if any(b in line for b in BAD_LOG)]
    assert not bad, bad[:5]
