"""A cap vLLM rejects on its own succeeds through Envoy + incontext, inside the window."""

import pytest

from tests.vllm.stack import C, MODEL, R, direct_post, fit_messages


# vLLM's message for a cap above the window (B > W), by release; the default is 0.31's and
# 0.32's wording ({field} is the cap's field).
CAP_OVER_WINDOW = {
    "0.11.0": "'max_tokens' or 'max_completion_tokens' is too large: 100000. This model's "
              "maximum context length is 512 tokens",
}
CAP_OVER_WINDOW_DEFAULT = "{field}=100000 cannot be greater than max_model_len=512"


def long_chat(vllm, target, nonce):
    def build(filler):
        return [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]
    msgs, p = fit_messages(vllm, target, build)
    return msgs, p


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_oversized_cap_rejected_by_vllm_succeeds_through_filter(vllm, exact, field):
    # A long prompt keeps the rewritten cap (C - P) small, so the generation is short.
    msgs, p = long_chat(vllm, 430, f"window-{field}")
    body = {"model": MODEL, "messages": msgs, field: 100000, "temperature": 0}

    direct = direct_post(vllm, body)
    assert direct.status_code == 400, direct.text[:300]
    message = CAP_OVER_WINDOW.get(vllm.release, CAP_OVER_WINDOW_DEFAULT).format(field=field)
    assert message in direct.text, direct.text[:300]

    res = exact.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == "exact", res.describe()
    usage = res.usage
    assert res.prompt_tokens_header == usage["prompt_tokens"] == p, res.describe()
    assert res.max_tokens_header == C - p, res.describe()
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= C, usage
    assert usage["completion_tokens"] <= C - p, usage


def test_learned_window_rewrites_the_same_way(vllm, learned):
    """Without context_length the filter learns C = 512 from /tokenize's max_model_len."""
    msgs, p = long_chat(vllm, 440, "window-learned")
    body = {"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0}
    assert direct_post(vllm, body).status_code == 400

    res = learned.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.prompt_tokens_header == res.usage["prompt_tokens"] == p, res.describe()
    assert res.max_tokens_header == C - p, res.describe()
    assert sum((res.usage["prompt_tokens"], res.usage["completion_tokens"])) <= C


def test_completion_endpoint_with_oversized_cap(vllm, exact):
    prompt = "Once upon a time" + " a" * 420
    p = vllm.tokenize({"model": MODEL, "prompt": prompt})["count"]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 100000, "temperature": 0}
    assert direct_post(vllm, body, "/v1/completions").status_code == 400

    res = exact.post(body, "/v1/completions")
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.prompt_tokens_header == res.usage["prompt_tokens"] == p, res.describe()
    assert res.max_tokens_header == C - p, res.describe()
    assert res.usage["prompt_tokens"] + res.usage["completion_tokens"] <= C


def test_window_exactly_r_left_rewrites_to_r(vllm, exact):
    """docs/spec.md §2 boundary, against the real tokenizer: C - P == R rewrites to R."""
    msgs, p = long_chat(vllm, C - R, "window-boundary")
    body = {"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0}
    res = exact.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.max_tokens_header == R, res.describe()
    assert res.usage["prompt_tokens"] == p == C - R, res.describe()


def test_window_r_minus_one_left_passes_unchanged(vllm, exact):
    """C - P == R - 1 and no caller cap: unchanged (passthrough); vLLM then uses its own
    default (the rest of the window) and answers 200."""
    msgs, p = long_chat(vllm, C - R + 1, "window-boundary-1")
    body = {"model": MODEL, "messages": msgs, "temperature": 0}
    res = exact.post(body)
    assert res.action == "unchanged:insufficient", res.describe()
    assert res.max_tokens_header is None, res.describe()
    assert res.prompt_tokens_header == p, res.describe()
    assert res.status == 200, res.describe()
    assert res.usage["prompt_tokens"] == p
