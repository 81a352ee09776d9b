"""The classic overflow, per vLLM release: a prompt of P tokens and a caller cap B that fits the
window on its own (B <= W) but not together with the prompt (P + B > W).

Straight to vLLM, releases before 0.32 answer 400 with their maximum-context-length message
(the error most deployments meet); 0.32 and later serve it and stop the generation at the
window. Through Envoy + incontext every release answers 200 with the cap lowered to W - P,
counted exactly, and prompt + completion <= W.
"""

import re

import pytest

from tests.vllm.stack import C, MODEL, direct_post, fit_messages, rejects_classic_overflow

P = 430          # prompt tokens
B = 200          # the caller's cap: B <= C, P + B > C


def overflow_chat(vllm, nonce):
    def build(filler):
        return [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]
    msgs, p = fit_messages(vllm, P, build)
    assert p == P
    return msgs


def overflow_prompt(vllm):
    prompt = "Once upon a time" + " a" * (P - 4)
    p = vllm.tokenize({"model": MODEL, "prompt": prompt})["count"]
    prompt += " a" * (P - p)
    assert vllm.tokenize({"model": MODEL, "prompt": prompt})["count"] == P
    return prompt


# vLLM's own message for P + B > W, per release and endpoint (the numbers are checked below).
AT_LEAST = re.compile(
    r"This model's maximum context length is (?P<w>\d+) tokens\. However, you requested "
    r"(?P<b>\d+) output tokens and your prompt contains at least (?P<p_min>\d+) input "
    r"tokens, for a total of at least (?P<total>\d+) tokens\.")
OVERFLOW_MESSAGE = {
    # Counts the prompt only as far as it overflows: "at least" W - B + 1 tokens.
    ("0.31.0", "chat"): AT_LEAST,
    ("0.31.0", "completions"): AT_LEAST,
    ("0.11.0", "chat"): re.compile(
        r"'max_tokens' or 'max_completion_tokens' is too large: (?P<b>\d+)\. This model's "
        r"maximum context length is (?P<w>\d+) tokens and your request has (?P<p>\d+) input "
        r"tokens \((?P=b) > (?P=w) - (?P=p)\)"),
    # The completions endpoint checks the prompt against W - B and calls that the maximum
    # context length.
    ("0.11.0", "completions"): re.compile(
        r"This model's maximum context length is (?P<w_minus_b>\d+) tokens\. However, your "
        r"request has (?P<p>\d+) input tokens\."),
}


def error_message(resp) -> str:
    err = resp.json()
    return err.get("message") or err.get("error", {}).get("message", "")


def assert_vllm_rejects_overflow(release, resp, p, b, endpoint="chat"):
    """vLLM's own 400 for P + B > W, in the wording of the release."""
    assert resp.status_code == 400, (release, resp.status_code, resp.text[:400])
    message = error_message(resp)
    pattern = OVERFLOW_MESSAGE.get((release, endpoint))
    assert pattern is not None, f"no overflow message recorded for vLLM {release}: {message}"
    m = pattern.search(message)
    assert m, (release, message)
    got = m.groupdict()
    if "w" in got:
        assert int(got["w"]) == C, message
    if "b" in got:
        assert int(got["b"]) == b, message
    if "w_minus_b" in got:
        assert int(got["w_minus_b"]) == C - b, message
    if "p" in got:
        assert int(got["p"]) == p, message
    if "p_min" in got:
        assert C - b < int(got["p_min"]) <= p, message
    if "total" in got:
        assert C < int(got["total"]) <= p + b, message


def assert_vllm_serves_clamped(resp, p, endpoint_field="prompt_tokens"):
    """0.32 and later: served, the generation stops at the window."""
    assert resp.status_code == 200, resp.text[:400]
    usage = resp.json()["usage"]
    assert usage[endpoint_field] == p, usage
    assert usage["completion_tokens"] <= C - p, usage
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= C, usage


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_classic_overflow_chat(vllm, exact, field):
    msgs = overflow_chat(vllm, f"overflow-{field}")
    body = {"model": MODEL, "messages": msgs, field: B, "temperature": 0}

    direct = direct_post(vllm, body)
    if rejects_classic_overflow(vllm.release):
        assert_vllm_rejects_overflow(vllm.release, direct, P, B)
    else:
        assert_vllm_serves_clamped(direct, P)

    res = exact.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == "exact", res.describe()
    usage = res.usage
    assert res.prompt_tokens_header == usage["prompt_tokens"] == P, res.describe()
    assert res.max_tokens_header == C - P, res.describe()
    assert usage["completion_tokens"] <= C - P, usage
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= C, usage


def test_classic_overflow_chat_streaming(vllm, exact):
    msgs = overflow_chat(vllm, "overflow-stream")
    body = {"model": MODEL, "messages": msgs, "max_tokens": B, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}

    direct = direct_post(vllm, body)
    if rejects_classic_overflow(vllm.release):
        assert_vllm_rejects_overflow(vllm.release, direct, P, B)
    else:
        assert direct.status_code == 200, direct.text[:400]

    res = exact.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    usage = res.usage
    assert res.prompt_tokens_header == usage["prompt_tokens"] == P, res.describe()
    assert res.max_tokens_header == C - P, res.describe()
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= C, usage


def test_classic_overflow_completions(vllm, exact):
    prompt = overflow_prompt(vllm)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": B, "temperature": 0}

    direct = direct_post(vllm, body, "/v1/completions")
    if rejects_classic_overflow(vllm.release):
        assert_vllm_rejects_overflow(vllm.release, direct, P, B, "completions")
    else:
        assert_vllm_serves_clamped(direct, P)

    res = exact.post(body, "/v1/completions")
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == "exact", res.describe()
    usage = res.usage
    assert res.prompt_tokens_header == usage["prompt_tokens"] == P, res.describe()
    assert res.max_tokens_header == C - P, res.describe()
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= C, usage
