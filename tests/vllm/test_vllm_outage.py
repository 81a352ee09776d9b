"""Fail-open when vLLM is unreachable (runs last: it stops and restarts the session's vLLM).

The restart brings the server back with `--exclude-tools-when-tool-choice-none`, the flag the
next phase (test_vllm_exclude_tools.py) needs, so the release's server restarts once, not
twice; nothing this module sends has `tool_choice` "none", so the flag changes none of it.

With vLLM gone the filter's /tokenize call fails, so it budgets from the rough estimate plus F
(docs/spec.md §7) and lets the request through; Envoy itself then answers 503 because the upstream is
down. The filter must not be the one that breaks the request, Envoy must stay up, the failure
must be counted, and once vLLM is back exact counting resumes (failures are never cached).
"""

import re

import httpx
import pytest

from tests.harness.spec import estimate
from tests.vllm.stack import C, EXCLUDE_TOOLS_FLAG, F, MODEL, R, fit_messages

# It stops and restarts the session's vLLM: after every other test (tests/conftest.py).
pytestmark = [pytest.mark.last, pytest.mark.newest_vllm_only, pytest.mark.phase(1)]


ENVOY_UPSTREAM_ERROR = re.compile(r"upstream connect error|no healthy upstream|"
                                  r"connection refused|reset reason", re.I)
WASM_FAILURE = re.compile(r"panicked|Wasm VM failed|Function: proxy_on_\w+ failed|\[critical\]|"
                          r"restricted_callback|Uncaught")


def body(nonce, cap=100000):
    b = {"model": MODEL, "temperature": 0,
         "messages": [{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": f"Are you there? ({nonce})"}]}
    if cap is not None:
        b["max_tokens"] = cap
    return b


def failures(delta):
    return {k: v for k, v in delta.items() if k.startswith("incontext_tokenizer_failures_")}


def assert_envoy_ready(envoy):
    assert envoy.alive(), "Envoy exited"
    r = httpx.get(envoy.admin + "/ready", timeout=5)
    assert r.status_code == 200 and "LIVE" in r.text, r.text


def assert_failed_open(res):
    """The filter estimated and passed the request on; the 503 is Envoy's upstream error."""
    assert res.status == 503, res.describe()
    assert ENVOY_UPSTREAM_ERROR.search(res.resp.text), res.describe()
    assert "context_length_exceeded" not in res.resp.text, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == "estimate", res.describe()
    p = estimate(res.raw)
    assert res.prompt_tokens_header == p, res.describe()
    assert res.max_tokens_header == C - p - F, res.describe()
    assert sum(failures(res.delta).values()) == 1, res.describe()
    assert res.delta.get("incontext_estimates") == 1, res.describe()


def test_dead_upstream_fails_open(stack):
    """A second Envoy whose `vllm` cluster points at a port where nothing listens (vLLM up)."""
    client = stack.client("dead", dead_upstream=True)
    for i in range(3):   # failures are not cached: each request tries the tokenizer again
        res = client.post(body(f"dead-{i}"))
        assert_failed_open(res)
        assert res.delta.get("incontext_tokenizer_calls") == 1, res.describe()
    # GET passes untouched (no tokenizer call), Envoy still answers for the dead upstream.
    assert client.get("/v1/models").status_code == 503
    assert_envoy_ready(client.envoy)


def test_vllm_stopped_fails_open_then_recovers(vllm, stack, exact):
    warm = exact.post(body("outage-warm", cap=4))
    assert warm.status == 200 and warm.source == "exact", warm.describe()

    vllm.stop()
    assert not vllm.healthy()
    try:
        res = exact.post(body("outage-down"))
        assert_failed_open(res)
        assert_envoy_ready(exact.envoy)

        # An Envoy that never learned C (no context_length) cannot budget an estimate:
        # the request passes unchanged, still through Envoy.
        learned = stack.client("learned-outage", context_length=None)
        res = learned.post(body("outage-no-window"))
        assert res.status == 503, res.describe()
        assert ENVOY_UPSTREAM_ERROR.search(res.resp.text), res.describe()
        assert res.action == "unchanged:no_window", res.describe()
        assert sum(failures(res.delta).values()) == 1, res.describe()
        assert_envoy_ready(learned.envoy)

        # The count cache still serves a prompt counted before the outage (source cache).
        res = exact.post(body("outage-warm", cap=4))
        assert res.status == 503 and res.source == "cache", res.describe()
    finally:
        # Same port: the Envoy clusters point at it. With the next phase's flag (above).
        if EXCLUDE_TOOLS_FLAG not in vllm.extra_args:
            vllm.extra_args = (*vllm.extra_args, EXCLUDE_TOOLS_FLAG)
        vllm.start()

    # Back: exact counting again, through the very same Envoys.
    res = exact.post(body("outage-back", cap=4))
    assert res.status == 200, res.describe()
    assert res.source == "exact", res.describe()
    assert res.prompt_tokens_header == res.usage["prompt_tokens"], res.describe()
    assert not failures(res.delta), res.describe()

    # The Envoy that had no window learns C now (long prompt: the rewritten cap stays small).
    msgs, p = fit_messages(vllm, 440, lambda filler: [
        {"role": "user", "content": "Back again (outage-back-learned)" + filler}])
    res = learned.post({"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0})
    assert res.status == 200, res.describe()
    assert res.prompt_tokens_header == p, res.describe()
    assert res.action == "rewritten" and res.source == "exact", res.describe()
    assert res.max_tokens_header == C - res.usage["prompt_tokens"], res.describe()
    assert res.max_tokens_header >= R


@pytest.mark.phase(3)   # after test_vllm_exclude_tools.py too: every Envoy of the suite
def test_no_wasm_failures_in_envoy_logs(stack):
    stack.stop()   # flushes the logs
    found = []
    for name, env in stack.envoys.items():
        for line in env.log_text().splitlines():
            if WASM_FAILURE.search(line):
                found.append(f"{name}: {line[:300]}")
    assert stack.envoys, "no Envoy ran"
    assert not found, "wasm failures in Envoy logs:\n" + "\n".join(found[:20])
