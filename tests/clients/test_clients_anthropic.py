"""The official Anthropic SDK against vLLM's /v1/messages through Envoy + incontext
(docs/spec.md §10), as Claude-Code-style agents call it: max_tokens 32000 or 64000 whatever the
window.

Straight to vLLM 0.32 each of these requests fails (400: the cap is above max_model_len=512);
through Envoy it succeeds, the filter's count (x-incontext-prompt-tokens) equals vLLM's own
usage.input_tokens, and input + output fits the window.
"""

import anthropic
import httpx
import pytest

from tests.clients.stack import (ANTHROPIC_TOOLS, C, MODEL, R, anthropic_tool_history,
                                assert_rewritten_exact, count_anthropic, fit_anthropic, incontext,
                                input_tokens, int_header)


def sdk(url: str) -> anthropic.Anthropic:
    # An explicit timeout: without one the SDK itself refuses non-streaming calls whose
    # max_tokens could take longer than 10 minutes on Anthropic's own service.
    return anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=180)


def plain(nonce):
    def build(filler):
        return {"messages": [{"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]}
    return build


def system_string(filler):
    return {"system": "You are a careful assistant. Answer in English.",
            "messages": [{"role": "user", "content": f"Summarise this (system-str):{filler}"}]}


def system_blocks(filler):
    return {"system": [{"type": "text", "text": "You are a careful assistant."},
                       {"type": "text", "text": "Answer in English."}],
            "messages": [{"role": "user", "content": f"Summarise this (system-blocks):{filler}"}]}


def tools(filler):
    return {"tools": ANTHROPIC_TOOLS, "messages": anthropic_tool_history(filler)}


CASES = {
    "plain-32000": (plain("32000"), 32000),
    "plain-64000": (plain("64000"), 64000),
    "system-string": (system_string, 32000),
    "system-blocks": (system_blocks, 32000),
    "tools-history": (tools, 32000),
}


def assert_vllm_refuses(vllm, request, max_tokens):
    with pytest.raises(anthropic.BadRequestError) as e:
        sdk(vllm.url).messages.create(model=MODEL, max_tokens=max_tokens, **request)
    assert f"={max_tokens} cannot be greater than max_model_len={C}" in str(e.value), str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_messages_served_inside_the_window(vllm, envoy, case):
    build, max_tokens = CASES[case]
    request, p = fit_anthropic(vllm, 440, build)
    assert_vllm_refuses(vllm, request, max_tokens)

    raw = sdk(envoy.url).messages.with_raw_response.create(
        model=MODEL, max_tokens=max_tokens, extra_body={"temperature": 0}, **request)
    msg = raw.parse()
    assert_rewritten_exact(raw.headers, p, case)
    assert input_tokens(msg.usage) == p
    assert input_tokens(msg.usage) + msg.usage.output_tokens <= C, msg.usage
    written = int_header(raw.headers, "x-incontext-max-tokens")
    assert written is not None and written < max_tokens, raw.headers
    if msg.usage.output_tokens == written:
        # The window, not the caller's cap, ended the answer (docs/spec.md §13).
        assert msg.stop_reason == "model_context_window_exceeded", (msg.stop_reason, msg.usage)
    else:
        assert msg.stop_reason in ("end_turn", "tool_use"), (msg.stop_reason, msg.usage)


def test_streaming_final_usage(vllm, envoy):
    request, p = fit_anthropic(vllm, 440, plain("stream"))

    def call(url):
        return sdk(url).messages.with_streaming_response.create(
            model=MODEL, max_tokens=32000, stream=True, **request)

    with pytest.raises(anthropic.BadRequestError):
        with call(vllm.url):
            pass
    with call(envoy.url) as resp:
        headers = resp.headers
        events = list(resp.parse())
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    start = events[0].message.usage
    final = [e.usage for e in events if e.type == "message_delta"][-1]
    assert int_header(headers, "x-incontext-prompt-tokens") == input_tokens(start) == p
    assert_rewritten_exact(headers, p, "stream")
    assert 0 < final.output_tokens <= C - p, final
    assert input_tokens(start) + final.output_tokens <= C


def test_thinking_budget_with_no_valid_value_in_this_window(vllm, envoy):
    """vLLM requires budget_tokens >= 1024 (Anthropic's minimum) and < max_tokens, and refuses
    max_tokens above the 512-token window: no thinking request is valid here. The filter must
    not make it worse: it passes the request unchanged (with a reason); vLLM refuses it as it
    refuses the request sent directly, and the client gets that refusal as Anthropic's
    "prompt + cap too long" error, the one Claude Code retries with a smaller cap on
    (docs/spec.md §13)."""
    request, p = fit_anthropic(vllm, 300, plain("thinking-512"))
    body = {"model": MODEL, "max_tokens": 32000,
            "thinking": {"type": "enabled", "budget_tokens": 2048}, **request}
    direct = httpx.post(vllm.url + "/v1/messages", json=body, timeout=60)
    via = httpx.post(envoy.url + "/v1/messages", json=body, timeout=60)
    assert direct.status_code == 400, direct.text[:300]
    h = incontext(via.headers)
    assert h.get("x-incontext-action") == "unchanged:thinking_budget", h
    assert via.status_code == 400, via.text[:300]
    assert via.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": f"input length and `max_tokens` exceed context limit: {p} + 32000 > {C}, "
                   "decrease input length or `max_tokens` and try again"}}, via.text[:300]
    with pytest.raises(anthropic.BadRequestError) as e:
        sdk(envoy.url).messages.create(**body)
    assert "exceed context limit" in str(e.value), str(e.value)


def test_reject_mode_prompt_is_too_long(vllm, reject_envoy):
    """Fewer than R tokens left: the filter answers Anthropic's own error, which the SDK raises
    as BadRequestError and Claude Code compacts its conversation on."""
    request, p = fit_anthropic(vllm, C - R + 1, plain("reject"))
    with pytest.raises(anthropic.BadRequestError) as e:
        sdk(reject_envoy.url).messages.create(model=MODEL, max_tokens=32000, **request)
    assert "prompt is too long" in str(e.value), str(e.value)
    assert e.value.body["type"] == "error", e.value.body
    assert e.value.body["error"]["type"] == "invalid_request_error", e.value.body
    assert e.value.body["error"]["message"] == \
        f"prompt is too long: {p} tokens > {C - R} maximum", e.value.body
    assert e.value.response.headers.get("x-incontext-action") == "rejected"


@pytest.mark.parametrize("fault", ["status-500", "garbage", "slow"])
def test_counter_failure_estimates_and_serves(vllm, faulty_envoy, faults, fault):
    {"status-500": lambda: faults.tokenizer.status(500),
     "garbage": lambda: faults.tokenizer.garbage(),
     "slow": lambda: faults.tokenizer.slow(3.0)}[fault]()
    request, p = fit_anthropic(vllm, 300, plain(f"fault-{fault}"))
    raw = sdk(faulty_envoy.url).messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, **request)
    msg = raw.parse()
    h = incontext(raw.headers)
    assert h.get("x-incontext-source") == "estimate", h
    assert h.get("x-incontext-action") == "rewritten", h
    assert input_tokens(msg.usage) == p
    assert len(faults.tokenizer.snapshot()) >= 1, "the counter was never asked"


def test_count_tokens_passes_unchanged(vllm, envoy):
    request, p = fit_anthropic(vllm, 400, tools)
    raw = sdk(envoy.url).messages.with_raw_response.count_tokens(model=MODEL, **request)
    assert raw.parse().input_tokens == p == count_anthropic(vllm, request)
    assert raw.headers.get("x-incontext-action") == "unchanged:count_only", incontext(raw.headers)
