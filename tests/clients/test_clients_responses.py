"""The OpenAI SDK's Responses API (`/v1/responses`, what Codex CLI speaks) through Envoy +
incontext in front of the real vLLM 0.32 started with `--enable-scale-out`, so the filter
counts each request exactly with vLLM's `/v1/responses/render` (docs/spec.md §14).

Straight to vLLM a `max_output_tokens` above the window is refused; through Envoy the filter
writes `max_output_tokens` = the rest of the window, its count equals vLLM's
`usage.input_tokens`, and prompt + output fits. A request without a cap (Codex's: streamed,
`store: false`) is budgeted too; a stateful one (`previous_response_id`) passes unchanged; in
reject mode a prompt that leaves less than R is answered with `context_length_exceeded`,
`param` `input`, which the SDK raises as `BadRequestError`.
"""

import httpx
import openai
import pytest

from tests.clients.stack import BIG, C, FILLER, MODEL, R, StackError, incontext, int_header


def sdk(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=180)


TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def items(nonce):
    return lambda filler: [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]


def tool_history(nonce):
    return lambda filler: [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C, light rain"},
        {"role": "user", "content": f"Explain it ({nonce}):{filler}"}]


def render_count(vllm, request: dict) -> int:
    """vLLM's own count of a Responses request: its /v1/responses/render token ids."""
    body = {k: v for k, v in request.items() if k not in ("max_output_tokens", "stream")}
    r = httpx.post(vllm.url + "/v1/responses/render", json=body, timeout=60)
    if r.status_code != 200:
        raise StackError(f"/v1/responses/render answered {r.status_code}: {r.text[:300]} "
                         "(is vLLM started with --enable-scale-out?)")
    return len(r.json()["token_ids"])


def fit(vllm, target, build, **extra):
    """A Responses request (``build(filler)`` -> input) of exactly ``target`` input tokens."""
    def request(n):
        return {"model": MODEL, "input": build(FILLER * n), **extra}
    n = 0
    for _ in range(8):
        got = render_count(vllm, request(n))
        if got == target:
            return request(n), got
        n += target - got
        if n < 0:
            break
    raise StackError(f"could not size a Responses request to {target} tokens (last {got})")


def assert_budgeted(headers, p):
    h = incontext(headers)
    assert h.get("x-incontext-action") == "rewritten", h
    assert h.get("x-incontext-source") == "exact", h
    assert int_header(headers, "x-incontext-prompt-tokens") == p, h
    assert int_header(headers, "x-incontext-max-tokens") == C - p, h


@pytest.mark.parametrize("shape", ["text", "items", "tools"])
def test_a_cap_above_the_window_is_refused_directly_and_served_through_incontext(
        vllm, envoy, shape):
    build = {"text": lambda f: f"Say hello to the reader ({shape}):{f}",
             "items": items(shape), "tools": tool_history(shape)}[shape]
    extra = {"tools": TOOLS} if shape == "tools" else {}
    request, p = fit(vllm, 440, build, **extra)
    with pytest.raises(openai.BadRequestError) as e:
        sdk(vllm.url).responses.create(**request, max_output_tokens=BIG)
    assert f"max_output_tokens={BIG} cannot be greater than max_model_len={C}" in str(e.value)

    raw = sdk(envoy.url).responses.with_raw_response.create(
        **request, max_output_tokens=BIG, temperature=0)
    done = raw.parse()
    assert_budgeted(raw.headers, p)
    assert done.usage.input_tokens == p, done.usage
    assert done.usage.input_tokens + done.usage.output_tokens <= C, done.usage


def test_codex_style_stream_without_a_cap_is_budgeted(vllm, envoy):
    """Codex CLI: streamed, stateless, `store: false`, tools, no `max_output_tokens`."""
    request, p = fit(vllm, 430, tool_history("codex"), tools=TOOLS, store=False,
                     instructions="You are a coding agent.")
    with sdk(envoy.url).responses.with_streaming_response.create(
            **request, stream=True, temperature=0) as resp:
        headers = resp.headers
        events = list(resp.parse())
    assert_budgeted(headers, p)
    done = [e for e in events if e.type == "response.completed"]
    assert len(done) == 1, [e.type for e in events][-5:]
    usage = done[0].response.usage
    assert usage.input_tokens == p, usage
    assert usage.input_tokens + usage.output_tokens <= C, usage


def test_a_stateful_request_passes_unchanged(vllm, envoy):
    """`previous_response_id` continues state the filter cannot see: the request goes to vLLM
    as it came (vLLM stores no responses by default, so it answers 404 either way)."""
    request = {"model": MODEL, "input": "Which word?", "max_output_tokens": BIG,
               "previous_response_id": "resp_0123456789abcdef"}
    answers = []
    for url in (vllm.url, envoy.url):
        answers.append(httpx.post(url + "/v1/responses", json=request, timeout=60))
    direct, via = answers
    assert incontext(via.headers).get("x-incontext-action") == "unchanged:stateful", via.headers
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    assert via.status_code >= 400


def test_reject_mode_answers_context_length_exceeded_on_input(vllm, reject_envoy):
    request, p = fit(vllm, C - R + 1, items("reject"))      # R - 1 left
    before = reject_envoy.counters()
    with pytest.raises(openai.BadRequestError) as e:
        sdk(reject_envoy.url).responses.create(**request, max_output_tokens=BIG)
    assert e.value.code == "context_length_exceeded"
    assert e.value.param == "input"
    assert e.value.response.headers.get("x-incontext-action") == "rejected"
    assert int_header(e.value.response.headers, "x-incontext-prompt-tokens") == p
    after = reject_envoy.counters()
    assert after.get("incontext_rejected", 0) - before.get("incontext_rejected", 0) == 1, \
        (before, after)
