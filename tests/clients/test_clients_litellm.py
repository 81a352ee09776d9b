"""LiteLLM as a library (what agents such as OpenHands call) through Envoy + incontext to the
real vLLM 0.32, as an agent configures it: model "openai/qwen3-tiny", api_base = Envoy.

Straight to vLLM the oversized caps raise litellm.BadRequestError, which is NOT LiteLLM's
ContextWindowExceededError, so an agent cannot tell it needs to shorten its history; through
Envoy the calls succeed. In reject mode, a prompt that leaves less than the minimum output is
answered by the filter and reaches LiteLLM as ContextWindowExceededError, the error agents
condense their history on, and the OpenAI SDK as BadRequestError code context_length_exceeded.
"""

import tests.clients.stack  # noqa: F401,I001  (LiteLLM offline switches, before importing it)

import litellm
import openai
import pytest

from tests.clients.stack import BIG, C, MODEL, R, TOOLS, fit_chat, fit_messages, tool_history

LITELLM_MODEL = f"openai/{MODEL}"


def call(url, **kw):
    return litellm.completion(model=LITELLM_MODEL, api_base=url + "/v1", api_key="x",
                              num_retries=0, timeout=180, **kw)


def headers_of(resp) -> dict:
    """The upstream response headers LiteLLM keeps (prefixed llm_provider-)."""
    hs = (resp._hidden_params or {}).get("additional_headers") or {}
    return {k[len("llm_provider-"):]: v for k, v in hs.items() if k.startswith("llm_provider-")}


def near_window(vllm, nonce, target=440):
    def build(filler):
        return [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]
    return fit_messages(vllm, target, build)


def assert_vllm_bad_request(vllm, field, **kw):
    with pytest.raises(litellm.BadRequestError) as e:
        call(vllm.url, **kw)
    assert not isinstance(e.value, litellm.ContextWindowExceededError), type(e.value)
    assert f"{field}={BIG} cannot be greater than max_model_len={C}" in str(e.value), str(e.value)


def assert_served(resp, p):
    h = headers_of(resp)
    assert h.get("x-incontext-action") == "rewritten", h
    assert h.get("x-incontext-source") == "exact", h
    assert int(h["x-incontext-prompt-tokens"]) == resp.usage.prompt_tokens == p, (h, resp.usage)
    assert int(h["x-incontext-max-tokens"]) == C - p, h
    assert resp.usage.prompt_tokens + resp.usage.completion_tokens <= C, resp.usage


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_with_a_cap_of_32768(vllm, envoy, field):
    msgs, p = near_window(vllm, f"litellm-{field}")
    kw = dict(messages=msgs, temperature=0, **{field: BIG})
    assert_vllm_bad_request(vllm, field, **kw)
    assert_served(call(envoy.url, **kw), p)


def test_streaming_with_usage(vllm, envoy):
    msgs, p = near_window(vllm, "litellm-stream")
    kw = dict(messages=msgs, max_tokens=BIG, temperature=0, stream=True,
              stream_options={"include_usage": True})
    with pytest.raises(litellm.BadRequestError):
        for _ in call(vllm.url, **kw):
            pass
    stream = call(envoy.url, **kw)
    chunks = list(stream)
    usage = [c.usage for c in chunks if getattr(c, "usage", None)]
    assert usage, "no usage in the stream"
    h = headers_of(stream)
    assert h.get("x-incontext-action") == "rewritten", h
    assert int(h["x-incontext-prompt-tokens"]) == usage[-1].prompt_tokens == p, (h, usage[-1])
    assert usage[-1].prompt_tokens + usage[-1].completion_tokens <= C


def test_two_tools_and_a_tool_call_history(vllm, envoy):
    msgs, p = fit_chat(vllm, 440, tool_history("litellm-tools"), tools=TOOLS)
    kw = dict(messages=msgs, tools=TOOLS, max_tokens=BIG, temperature=0)
    assert_vllm_bad_request(vllm, "max_tokens", **kw)
    assert_served(call(envoy.url, **kw), p)


def test_n_2(vllm, envoy):
    msgs, p = near_window(vllm, "litellm-n2")
    kw = dict(messages=msgs, n=2, max_tokens=BIG, temperature=0.8)
    assert_vllm_bad_request(vllm, "max_tokens", **kw)
    resp = call(envoy.url, **kw)
    assert len(resp.choices) == 2
    h = headers_of(resp)
    assert h.get("x-incontext-action") == "rewritten", h
    assert int(h["x-incontext-prompt-tokens"]) == resp.usage.prompt_tokens == p
    # each choice is capped at C - p; usage counts both
    assert resp.usage.completion_tokens <= 2 * (C - p), resp.usage


def test_legacy_completions(vllm, envoy):
    prompt = "Once upon a time (litellm)" + " a" * 420
    p = vllm.tokenize({"model": MODEL, "prompt": prompt})["count"]

    def text(url):
        return litellm.text_completion(model=f"text-completion-openai/{MODEL}",
                                       api_base=url + "/v1", api_key="x", prompt=prompt,
                                       max_tokens=BIG, temperature=0, timeout=180)

    with pytest.raises(litellm.BadRequestError) as e:
        text(vllm.url)
    assert f"max_tokens={BIG} cannot be greater than max_model_len={C}" in str(e.value)
    before = envoy.counters()
    resp = text(envoy.url)
    after = envoy.counters()
    assert after.get("incontext_rewritten", 0) - before.get("incontext_rewritten", 0) == 1
    assert resp.usage.prompt_tokens == p
    assert resp.usage.prompt_tokens + resp.usage.completion_tokens <= C, resp.usage


def test_reject_mode_raises_context_window_exceeded(vllm, reject_envoy):
    msgs, p = near_window(vllm, "litellm-reject", target=C - R + 1)   # R - 1 left
    with pytest.raises(litellm.ContextWindowExceededError) as e:
        call(reject_envoy.url, messages=msgs, max_tokens=BIG, temperature=0)
    assert e.value.status_code == 400


def test_reject_mode_openai_sdk_sees_context_length_exceeded(vllm, reject_envoy):
    msgs, p = near_window(vllm, "litellm-reject-sdk", target=C - R + 1)
    client = openai.OpenAI(base_url=reject_envoy.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=BIG)
    assert e.value.code == "context_length_exceeded", e.value.body
    assert e.value.response.headers.get("x-incontext-action") == "rejected"
    assert int(e.value.response.headers["x-incontext-prompt-tokens"]) == p
