"""Structured output and forced tool calls are counted exactly, on every vLLM release.

`response_format` (json_object, json_schema) and a forced `tool_choice` ("required", a named
function) constrain decoding; they do not change the prompt vLLM renders with the Qwen3 chat
template, so the filter counts them with /tokenize like any other chat request (docs/spec.md §5): the
source is `exact` (then `cache` on the identical repeat) and `x-incontext-prompt-tokens`
equals vLLM's `usage.prompt_tokens`. Each request carries the two tools of the count suite.
"""

import pytest

from tests.vllm.test_vllm_counts import SYSTEM, TOOLS, check_exact_then_cache, chat, user
from tests.vllm.stack import direct_post, stream_usage

JSON_SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "weather", "strict": True,
    "schema": {"type": "object",
               "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
               "required": ["city", "temp_c"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def ask(n, text="Weather in Paris, as JSON please."):
    return [SYSTEM, user(f"{text} ({n})")]


STRUCTURED = {
    "response_format-json_object": lambda n: chat(
        n, ask(n), response_format={"type": "json_object"}),
    "response_format-json_schema": lambda n: chat(n, ask(n), response_format=JSON_SCHEMA),
    "response_format-json_object+tools": lambda n: chat(
        n, ask(n), tools=TOOLS, response_format={"type": "json_object"}),
    "tool_choice-required": lambda n: chat(n, ask(n), tools=TOOLS, tool_choice="required"),
    "tool_choice-named": lambda n: chat(n, ask(n), tools=TOOLS, tool_choice=NAMED),
    "tool_choice-required-stream": lambda n: chat(
        n, ask(n), tools=TOOLS, tool_choice="required", stream=True,
        stream_options={"include_usage": True}),
    "tool_choice-named-max_completion_tokens": lambda n: {
        k: v for k, v in chat(n, ask(n), tools=TOOLS, tool_choice=NAMED,
                              max_completion_tokens=4).items() if k != "max_tokens"},
}


# vLLM 0.11 parses a non-streamed tool_choice "required" generation as a JSON list and answers
# 400 ("Invalid JSON: EOF while parsing a list") when max_tokens cuts it; the random-weight
# model never closes the list, whatever the cap. The same request streamed is served, with
# usage in the last chunk.
STREAM_REQUIRED = {"0.11.0"}


def structured(release, shape, nonce):
    body = STRUCTURED[shape](nonce)
    if release in STREAM_REQUIRED and body.get("tool_choice") == "required":
        body.update(stream=True, stream_options={"include_usage": True})
    return body


@pytest.mark.parametrize("shape", list(STRUCTURED))
def test_structured_and_forced_tool_calls_counted_exactly(vllm, exact, shape):
    body = structured(vllm.release, shape, f"{shape}-structured")
    check_exact_then_cache(exact, f"{vllm.release} C=512", shape, body)


@pytest.mark.parametrize("shape", list(STRUCTURED))
def test_tokenize_payload_equals_vllm_usage_for_structured(vllm, shape):
    """Straight to vLLM: /tokenize with the docs/spec.md §5 payload (model, messages, tools; no
    response_format, no tool_choice) counts what the chat endpoint reports in usage, so an
    exact count of these requests is possible on this release."""
    body = structured(vllm.release, shape, f"{shape}-direct")
    payload = {"model": body["model"], "messages": body["messages"]}
    if "tools" in body:
        payload["tools"] = body["tools"]
    count = vllm.tokenize(payload)["count"]
    resp = direct_post(vllm, body)
    assert resp.status_code == 200, resp.text[:300]
    usage = stream_usage(resp.text) if body.get("stream") else resp.json()["usage"]
    assert count == usage["prompt_tokens"], (shape, count, usage)
