"""Several hundred concurrent mixed requests (HTTP/1.1 and HTTP/2) through Envoy's two workers:
every one delivered, every body intact or rewritten exactly as docs/spec.md says."""

import asyncio
import base64
import json
import random
import re

import httpx

from tests.e2e.common import C, F, MODEL, R, W, chat, completion, dumps, nonce
from tests.harness.spec import decide, estimate, non_cap_members_kept, rewritten_obj
from tests.harness.upstream import ok

N = 400
COUNT_RE = re.compile(rb"count=(\d+)")


def tokenizer_behaviour(rec):
    if b"FAILME" in rec.body:
        return ("raw", 500, b'{"error":"scripted"}', "application/json")
    m = COUNT_RE.search(rec.body)
    return ok(int(m.group(1)) if m else 1, C)


def make_case(i, rng):
    kind = rng.choice(["chat", "chat", "chat", "chat_small", "chat_full", "chat_fail",
                       "completion", "completion_nocap", "token_ids", "get", "not_json"])
    n = nonce()
    if kind == "get":
        return dict(kind=kind, method="GET", path=f"/v1/models?i={i}", body=None)
    if kind == "not_json":
        return dict(kind=kind, method="POST", path="/v1/chat/completions",
                    body=f"plain text {i} {n}".encode(), expect="unchanged:not_json")
    if kind.startswith("chat"):
        count = {"chat": rng.randint(1, 25000), "chat_small": rng.randint(1, 30000),
                 "chat_full": rng.randint(W - R + 1, W + 100), "chat_fail": 0}[kind]
        cap = {"chat": rng.choice([None, 100000, "2048", 9000.0]), "chat_small": 64,
               "chat_full": None, "chat_fail": 100000}[kind]
        text = f"req {i} {n} count={count}" + (" FAILME" if kind == "chat_fail" else "")
        text += " pad" * rng.randint(0, 300)
        extra = {} if cap is None else {rng.choice(["max_tokens", "max_completion_tokens"]): cap}
        body = dumps(chat(text, temperature=0.3, **extra))
        exact = kind != "chat_fail"
        P = count if exact else estimate(body)
        return dict(kind=kind, method="POST", path="/v1/chat/completions", body=body, P=P,
                    exact=exact)
    if kind == "completion":
        count = rng.randint(1, 30000)
        body = dumps(completion(f"story {i} {n} count={count}", max_tokens=rng.choice([16, 100000])))
        return dict(kind=kind, method="POST", path="/v1/completions", body=body, P=count, exact=True)
    if kind == "completion_nocap":
        body = dumps(completion(f"story {i} {n} count=5"))
        return dict(kind=kind, method="POST", path="/v1/completions", body=body,
                    expect="unchanged:no_cap")
    ids = [rng.randint(0, 1000) for _ in range(rng.randint(1, 3000))]
    body = dumps(completion(ids, max_tokens=100000, user=n))
    return dict(kind=kind, method="POST", path="/v1/completions", body=body, P=len(ids), exact=True)


def check(case, resp):
    where = f"{case['kind']} {case['path']}: {resp.status_code} {dict(resp.headers)}"
    assert resp.status_code == 200, where
    echo = resp.json()
    sent = case["body"]
    if sent is None:
        assert echo["method"] == "GET" and echo["path"] == case["path"], where
        assert resp.headers.get("x-incontext-action") == "unchanged:method", where
        return "unchanged:method"
    got = base64.b64decode(echo["body_b64"])
    cl = dict((k.lower(), v) for k, v in echo["headers"]).get("content-length")
    assert cl == str(len(got)), f"{where}: content-length {cl} for {len(got)} bytes"
    action = resp.headers.get("x-incontext-action")
    if "expect" in case:
        assert action == case["expect"], where
        assert got == sent, where
        return action
    obj = json.loads(sent)
    d = decide(obj, case["P"], case["exact"], W=W, C=C, R=R, F=F)
    if d.rewrite:
        assert action == "rewritten", f"{where}: expected {d}"
        assert resp.headers.get("x-incontext-max-tokens") == str(d.value), where
        assert json.loads(got) == rewritten_obj(obj, d), where
        assert not non_cap_members_kept(sent, got), where
    else:
        assert action == "unchanged:insufficient", f"{where}: expected {d}"
        assert got == sent, where
    want_source = {"exact", "cache"} if case["exact"] else {"estimate"}
    if case["kind"] == "token_ids":
        want_source = {"exact"}
    assert resp.headers.get("x-incontext-source") in want_source, where
    assert resp.headers.get("x-incontext-prompt-tokens") == str(case["P"]), where
    return action


async def run_all(url, cases):
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as h1, \
            httpx.AsyncClient(base_url=url, timeout=120, http1=False, http2=True) as h2:
        async def one(i, case):
            client = h2 if i % 3 == 0 else h1
            headers = {"content-type": "application/json"} if case["body"] is not None else {}
            return await client.request(case["method"], case["path"], content=case["body"],
                                        headers=headers)
        return await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)),
                                    return_exceptions=True)


def test_concurrent_mixed_requests(proxy, upstream):
    upstream.tokenizer.respond(tokenizer_behaviour)
    rng = random.Random(20261130)
    cases = [make_case(i, rng) for i in range(N)]
    before = proxy.envoy.counters()
    responses = asyncio.run(run_all(proxy.envoy.url, cases))
    errors = [(c["kind"], repr(r)) for c, r in zip(cases, responses) if isinstance(r, Exception)]
    assert not errors, f"{len(errors)} requests failed: {errors[:5]}"
    actions = {}
    failures = []
    for case, resp in zip(cases, responses):
        try:
            a = check(case, resp)
            actions[a] = actions.get(a, 0) + 1
        except AssertionError as e:
            failures.append(str(e)[:400])
    assert not failures, f"{len(failures)} of {N} wrong: {failures[:5]}"
    assert len(upstream.snapshot()) == N
    assert actions.get("rewritten", 0) > N // 3, actions
    after = proxy.envoy.counters()
    assert after.get("incontext_requests", 0) - before.get("incontext_requests", 0) == N
    assert proxy.envoy.alive()
