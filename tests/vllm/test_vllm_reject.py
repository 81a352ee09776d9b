"""on_insufficient: "reject" with the real tokenizer: a prompt that leaves less than R gets a
400 context_length_exceeded from Envoy, and vLLM never sees the request."""

from tests.vllm.stack import C, MODEL, R, cluster_counter, fit_messages


def near_window(vllm, target, nonce):
    def build(filler):
        return [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Read this and answer ({nonce}):{filler}"}]
    return fit_messages(vllm, target, build)


def test_reject_when_less_than_r_remains(vllm, reject):
    msgs, p = near_window(vllm, C - R + 1, "reject-r-1")      # C - P = R - 1
    body = {"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0}
    chats_before = vllm.http_requests("/v1/chat/completions")
    rq_before = cluster_counter(reject.envoy, "upstream_rq_total")

    res = reject.post(body)

    assert res.status == 400, res.describe()
    err = res.json()["error"]
    assert err["code"] == "context_length_exceeded", res.describe()
    assert err["message"] == (
        f"This model's maximum context length is {C} tokens. However, your messages resulted "
        f"in {p + R} tokens ({p} in the messages, {R} in the completion). Please reduce the "
        "length of the messages or completion."), err
    assert res.action == "rejected", res.describe()
    assert res.prompt_tokens_header == p, res.describe()
    assert res.delta.get("incontext_rejected") == 1, res.describe()
    # vLLM got the /tokenize call and nothing else.
    rq_delta = cluster_counter(reject.envoy, "upstream_rq_total") - rq_before
    assert rq_delta == res.delta.get("incontext_tokenizer_calls", 0) == 1, (rq_delta, res.describe())
    assert vllm.http_requests("/v1/chat/completions") == chats_before


def test_reject_on_cache_hit_too(vllm, reject):
    """The same prompt again: counted from the cache, rejected again, still nothing upstream."""
    msgs, p = near_window(vllm, C - 10, "reject-cache")
    body = {"model": MODEL, "messages": msgs, "temperature": 0}
    first = reject.post(body)
    assert first.status == 400 and first.source == "exact", first.describe()
    chats_before = vllm.http_requests("/v1/chat/completions")
    rq_before = cluster_counter(reject.envoy, "upstream_rq_total")
    again = reject.post(body)
    assert again.status == 400, again.describe()
    assert again.json()["error"]["code"] == "context_length_exceeded"
    assert again.source == "cache", again.describe()
    assert cluster_counter(reject.envoy, "upstream_rq_total") == rq_before
    assert vllm.http_requests("/v1/chat/completions") == chats_before


def test_reject_mode_still_serves_when_r_remains(vllm, reject):
    msgs, p = near_window(vllm, C - R, "reject-r")              # C - P = R exactly
    body = {"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0}
    res = reject.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten" and res.max_tokens_header == R, res.describe()
    assert res.usage["prompt_tokens"] == p
    assert res.usage["prompt_tokens"] + res.usage["completion_tokens"] <= C


def test_reject_mode_small_caller_cap_that_fits_is_served(vllm, reject):
    """A caller cap smaller than R is the request's own minimum: 10 tokens left, cap 4 fits."""
    msgs, p = near_window(vllm, C - 10, "reject-small-cap")
    body = {"model": MODEL, "messages": msgs, "max_tokens": 4, "temperature": 0}
    res = reject.post(body)
    assert res.status == 200, res.describe()
    assert res.action == "rewritten" and res.max_tokens_header == 4, res.describe()
    assert res.usage["prompt_tokens"] == p


def test_prompt_over_the_window_is_rejected_by_the_filter_not_vllm(vllm, reject):
    """P >= C: vLLM itself would answer 400 with its own message; the filter answers first with
    the OpenAI-style code agents look for."""
    msgs, p = near_window(vllm, C + 20, "reject-over")
    body = {"model": MODEL, "messages": msgs, "temperature": 0}
    chats_before = vllm.http_requests("/v1/chat/completions")
    res = reject.post(body)
    assert res.status == 400, res.describe()
    assert res.json()["error"]["code"] == "context_length_exceeded", res.describe()
    assert res.json()["error"]["message"] == (
        f"This model's maximum context length is {C} tokens. However, your messages resulted "
        f"in {p} tokens. Please reduce the length of the messages."), res.describe()
    assert res.prompt_tokens_header == p
    assert vllm.http_requests("/v1/chat/completions") == chats_before
