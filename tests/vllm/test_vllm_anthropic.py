"""Anthropic Messages (docs/spec.md §10) through Envoy + incontext against the real vLLM.

The count comes from vLLM's own `/v1/messages/count_tokens` and must equal the
`usage.input_tokens` vLLM reports for the same request; the window C is configured
(`exact`) or learned once per route from `GET /v1/models` (`learned`).
"""

from __future__ import annotations

import json

import pytest

from tests.vllm.stack import C, R, direct_post, head_prompt_tokens

# vLLM 0.11 has no Anthropic API (tests/vllm/test_vllm_anthropic_api.py shows the 404).
pytestmark = pytest.mark.needs_messages_api

PATH = "/v1/messages"
MODEL = "qwen3-tiny"

TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}},
    {"name": "get_time", "description": "Local time in a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}},
]

CASES = {
    "plain": {"messages": [{"role": "user", "content": "Say hello in three words."}]},
    "system_string": {"system": "You are terse. " * 12,
                      "messages": [{"role": "user", "content": "Name a colour."}]},
    "system_blocks": {"system": [{"type": "text", "text": "You are a careful assistant."},
                                 {"type": "text", "text": "Answer in one line. " * 8}],
                      "messages": [{"role": "user", "content": [
                          {"type": "text", "text": "What is two plus two?"}]}]},
    "tools_history": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "4 C, light rain"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": [{"type": "text", "text": "14:05"}]}]},
    ]},
}


def body(case: str, max_tokens, **extra) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, **CASES[case], **extra}


def check(reply, label=""):
    assert reply.status == 200, reply.describe()
    assert reply.action == "rewritten", reply.describe()
    usage = reply.json()["usage"]
    input_tokens = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert reply.prompt_tokens_header == input_tokens, (label, reply.describe(), usage)
    assert reply.max_tokens_header == C - input_tokens, reply.describe()
    assert input_tokens + usage["output_tokens"] <= C, usage
    return input_tokens


def check_head(reply, label=""):
    """``check`` for a stream closed after its `message_start` (Client.post_head): vLLM
    accepted the rewritten cap (HTTP 200, a stream) and reports its own count there."""
    assert reply.status == 200, reply.describe()
    assert reply.action == "rewritten", reply.describe()
    input_tokens = head_prompt_tokens(reply.events)
    assert input_tokens is not None, (label, reply.describe())
    assert reply.prompt_tokens_header == input_tokens, (label, reply.describe())
    assert reply.max_tokens_header == C - input_tokens, reply.describe()
    return input_tokens


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("cap", [32000, 64000])
def test_messages_count_equals_vllm_usage(exact, vllm, case, cap):
    b = body(case, cap)
    direct = direct_post(vllm, b, PATH)
    assert direct.status_code == 400, direct.text[:300]   # max_tokens > max_model_len
    # Streamed and closed after message_start: the count and the rewrite are what is checked
    # here, not a whole generation (test_messages_window_learned_from_models reads a whole
    # non-streamed answer).
    reply = exact.post_head(b, PATH)
    # The cap is not part of what is counted: the second cap of a case is a cache hit.
    assert reply.source == ("exact" if cap == 32000 else "cache"), reply.describe()
    check_head(reply, case)
    again = exact.post_head(b, PATH)
    assert again.source == "cache" and again.prompt_tokens_header == reply.prompt_tokens_header


def test_messages_window_learned_from_models(learned):
    reply = learned.post(body("tools_history", 32000), PATH)
    assert reply.source == "exact", reply.describe()
    check(reply)


def test_messages_string_cap_is_read_laxly(exact):
    reply = exact.post_head(body("plain", "32000"), PATH)
    check_head(reply)
    assert json.loads(reply.raw)["max_tokens"] == "32000"


def test_thinking_budget_kept_below_the_new_cap(exact, vllm):
    b = body("plain", 32000, thinking={"type": "enabled", "budget_tokens": 20000})
    reply = exact.post(b, PATH)
    # The window leaves fewer than Anthropic's minimum budget (1024) + 1: no valid request.
    assert reply.status == 200 or reply.status == 400, reply.describe()
    assert reply.action == "unchanged:thinking_budget", reply.describe()


def test_streaming_reports_the_same_count(exact):
    # The whole stream (message_start to message_stop) through the filter.
    b = body("system_blocks", 32000, stream=True)
    reply = exact.post(b, PATH)
    assert reply.status == 200 and reply.action == "rewritten", reply.describe()
    events = [json.loads(line[6:]) for line in reply.resp.text.splitlines()
              if line.startswith("data: ")]
    kinds = [e.get("type") for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds[:3] + kinds[-3:]
    start = events[0]["message"]["usage"]
    assert reply.prompt_tokens_header == start["input_tokens"] + start.get(
        "cache_read_input_tokens", 0)


def test_count_tokens_passes_unchanged(exact):
    b = {"model": MODEL, **CASES["tools_history"]}
    reply = exact.post(b, PATH + "/count_tokens")
    assert reply.status == 200, reply.describe()
    assert reply.action == "unchanged:count_only"
    assert reply.json()["input_tokens"] > 0


def test_reject_mode_answers_prompt_is_too_long(reject, vllm):
    filler = "word " * 460   # between W - R and W: counted exactly, too little room left
    b = {"model": MODEL, "max_tokens": 32000,
         "messages": [{"role": "user", "content": filler}]}
    reply = reject.post(b, PATH)
    assert reply.status == 400, reply.describe()
    err = reply.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    prompt = reply.prompt_tokens_header
    assert err["error"]["message"] == f"prompt is too long: {prompt} tokens > {C - R} maximum"
