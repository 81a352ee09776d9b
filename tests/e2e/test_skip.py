"""docs/spec.md §15: a grown conversation whose cap a bound proves to fit goes upstream without
a count call on its path; it is counted once the upstream answered, and a count above its
bound turns skipping off for the route."""

import time

import pytest

from tests.e2e.common import C, assert_rewritten, assert_unchanged, cfg, chat, nonce
from tests.harness.upstream import ok

SKIP = cfg(skip_count=True)


def turns(n, cap):
    """The bodies of a conversation's first n turns (each adds a tool round)."""
    body = chat(f"fix the bug {nonce()}", max_tokens=cap)
    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    body["tools"] = tools
    out = []
    for i in range(n):
        out.append({**body, "messages": list(body["messages"])})
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "read", "arguments": f'{{"path":"f{i}"}}'}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 200}]
    return out


def second_turn(proxy, upstream, cap, answer):
    """A conversation with caps ``cap`` whose first turn is counted as 1000 (and rewritten),
    then its second turn sent with the tokenizer answering ``answer(record)``: (the three
    turns, the second's result)."""
    t1, t2, t3 = turns(3, cap)
    upstream.tokenizer.count(1000)
    assert_rewritten(proxy.post(t1), 1000)
    upstream.tokenizer.respond(answer)
    return (t1, t2, t3), proxy.post(t2)


def assert_skipped(res):
    """Unchanged with the bound as its count, and no count call before it went upstream (the
    check after the upstream answered may already be in)."""
    assert_unchanged(res, "fits")
    assert res.source == "bound", res.describe()
    assert all(t.at > res.one.at for t in res.tokenize), res.describe()
    assert len(res.tokenize) <= 1, res.describe()


def wait_for_calls(upstream, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(upstream.tokenizer.snapshot()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"expected {n} tokenizer calls, saw {len(upstream.tokenizer.snapshot())}")


def test_a_grown_turn_skips_the_count_and_is_checked_after(proxy_for, upstream):
    proxy = proxy_for(SKIP, fresh=True)
    _, second = second_turn(proxy, upstream, 16000, lambda rec: ok(1000))
    assert_skipped(second)
    p_hi = int(second.h("x-incontext-prompt-tokens"))
    assert 1000 < p_hi <= C - 16000, second.describe()
    # Counted after the upstream answered (the request's own result had no call).
    wait_for_calls(upstream, 2)
    counters = proxy.envoy.counters()
    assert counters.get("incontext_count_skipped") == 1, counters
    assert counters.get("incontext_bound_checks") == 1, counters
    assert counters.get("incontext_unchanged_fits") == 1, counters
    assert counters.get("incontext_count_calls") == 1, counters
    assert counters.get("incontext_bound_violations", 0) == 0, counters
    # The count call's duration is an Envoy histogram.
    prom = proxy.envoy.prometheus()
    assert "incontext_count_ms_bucket" in prom and "incontext_count_ms_count" in prom, prom[-2000:]


def test_a_count_above_its_bound_turns_skipping_off(proxy_for, upstream):
    """A tokenizer whose counts break the byte bound (far more tokens than bytes)."""
    proxy, t3 = broken_bound(proxy_for, upstream)
    # 30000 + the bound of one more round + 100 still fits C: only the off switch counts it.
    third = proxy.post(t3)
    assert len(third.tokenize) == 1, third.describe()
    assert_rewritten(third, 30000)
    log = proxy.envoy.log_text()
    assert log.count("a count broke its bound") == 1, log[-3000:]
    assert '"content"' not in log and "fix the bug" not in log


def test_a_count_above_its_bound_is_counted(proxy_for, upstream):
    """Counted once, by the time the route's next request has gone through (the module moves
    a counter only through a stream: what an answer after its stream counts moves with the
    configuration's next one, docs/module.md)."""
    proxy, t3 = broken_bound(proxy_for, upstream)
    upstream.tokenizer.count(1000)
    assert_rewritten(proxy.post(t3), 1000)
    deadline = time.monotonic() + 10
    while proxy.envoy.counters().get("incontext_bound_violations", 0) == 0:
        assert time.monotonic() < deadline, proxy.envoy.counters()
        time.sleep(0.05)
    assert proxy.envoy.counters()["incontext_bound_violations"] == 1


def broken_bound(proxy_for, upstream):
    """A second turn skipped on its bound, whose count after its stream breaks the bound: the
    proxy, once its log says so, and the third turn."""
    proxy = proxy_for(SKIP, fresh=True)
    # The next call is the check of the skipped second turn.
    (_, _, t3), second = second_turn(proxy, upstream, 100, lambda rec: ok(30000))
    assert_skipped(second)
    wait_for_calls(upstream, 2)
    deadline = time.monotonic() + 20  # the log file is flushed every 100 ms
    while "a count broke its bound" not in proxy.envoy.log_text():
        assert time.monotonic() < deadline, proxy.envoy.log_tail()
        time.sleep(0.1)
    return proxy, t3


def test_on_by_default_off_when_asked_and_edited_history_counts(proxy_for, upstream):
    upstream.tokenizer.count(1000)
    default = proxy_for(cfg(), fresh=True)
    t1, t2 = turns(2, 16000)
    default.post(t1)
    assert_skipped(default.post(t2))
    plain = proxy_for(cfg(skip_count=False), fresh=True)
    t1, t2 = turns(2, 16000)
    plain.post(t1)
    assert_rewritten(plain.post(t2), 1000)
    skip = proxy_for(SKIP, fresh=True)
    t1, t2 = turns(2, 16000)
    skip.post(t1)
    t2["messages"][1] = {"role": "user", "content": "an edited question"}
    res = skip.post(t2)
    assert len(res.tokenize) == 1, res.describe()
    assert_rewritten(res, 1000)


def tail_count(anchor, tail):
    """A tokenizer that counts a whole conversation (it has the system prompt) as ``anchor``
    and the new messages alone as ``tail``."""
    def behaviour(rec):
        messages = rec.json().get("messages", [])
        whole = any(m.get("role") == "system" for m in messages)
        return ok(anchor if whole else tail)
    return behaviour


def test_the_new_messages_counted_alone_prove_what_their_bytes_do_not(proxy_for, upstream):
    proxy = proxy_for(SKIP, fresh=True)
    # W − B leaves 300 tokens after the first turn's 1000: a tool round's bytes (≈ 400) do not
    # prove the second turn fits, a quarter of them may.
    _, second = second_turn(proxy, upstream, C - 1300, tail_count(1000, 50))
    assert_unchanged(second, "fits")
    assert second.source == "bound", second.describe()
    assert int(second.h("x-incontext-prompt-tokens")) == 1000 + 50 + 16, second.describe()
    # One call before the request went upstream: the two new messages, without the tools.
    before = [t for t in second.tokenize if t.at < second.one.at]
    assert len(before) == 1, second.describe()
    tail = before[0].json()
    assert [m["role"] for m in tail["messages"]] == ["assistant", "tool"], tail
    assert "tools" not in tail and tail["add_generation_prompt"] is True, tail
    wait_for_calls(upstream, 3)  # the first turn's count, the tail's, the check's
    counters = proxy.envoy.counters()
    assert counters.get("incontext_tail_counts") == 1, counters
    assert counters.get("incontext_count_skipped") == 1, counters
    assert counters.get("incontext_count_calls") == 1, counters
    assert counters.get("incontext_bound_violations", 0) == 0, counters


def test_a_tail_the_tokenizer_refuses_is_counted_whole_from_then_on(proxy_for, upstream):
    proxy = proxy_for(SKIP, fresh=True)
    def refuse_tails(rec):
        if any(m.get("role") == "system" for m in rec.json().get("messages", [])):
            return ok(1000)
        return ("raw", 400, b'{"error":"roles must alternate: secret-canary"}', "application/json")
    (_, _, t3), second = second_turn(proxy, upstream, C - 1300, refuse_tails)
    assert_rewritten(second, 1000)
    assert len(second.tokenize) == 2, second.describe()   # the tail's, then the whole's
    counters = proxy.envoy.counters()
    assert counters.get("incontext_tokenizer_failures_status") == 1, counters
    # The third turn goes straight to the whole count.
    third = proxy.post(t3)
    assert len(third.tokenize) == 1, third.describe()
    assert_rewritten(third, 1000)
    assert proxy.envoy.counters().get("incontext_tail_counts") == 1
    deadline = time.monotonic() + 10
    while "did not count a conversation's new messages alone" not in proxy.envoy.log_text():
        assert time.monotonic() < deadline, proxy.envoy.log_tail()
        time.sleep(0.1)
    assert "secret-canary" not in proxy.envoy.log_text()
