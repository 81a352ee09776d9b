"""vLLM's render server as the counter (backend `vllm-render`, docs/spec.md §16), in front of a
separate real vLLM generation server: every dialect's count equals the generation server's own
`usage`, every count call goes to the render server (none to the generation server), and the
window is the render server's `/v1/models` `max_model_len`. A generation server asked to render
(vLLM without `--enable-scale-out`: 403) is a counted failure and the estimate."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.harness.cases import SYSTEM, TOOLS, assistant, user
from tests.render.conftest import F, MODEL, WINDOW
from tests.vllm.stack import head_prompt_tokens

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}

CHATS = {
    "plain": [user("Say hello in three words (render plain).")],
    "tools": [SYSTEM, user("What is the weather in Paris? (render tools)")],
    "tool_history": [SYSTEM, user("Weather in Paris? (render history)"),
                     {"role": "assistant", "content": None, "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
                     user("And tomorrow?")],
}

ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather for a city.",
                    "input_schema": {"type": "object",
                                     "properties": {"city": {"type": "string"}},
                                     "required": ["city"]}}]
ANTHROPIC = {
    "system": {"system": "You are terse. (render system)",
               "messages": [{"role": "user", "content": "Say hello."}]},
    "tools_history": {
        "system": [{"type": "text", "text": "You are terse."}], "tools": ANTHROPIC_TOOLS,
        "messages": [
            {"role": "user", "content": "Weather in Paris? (render anthropic history)"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, clear"}]}]},
}


def counts_on_render_only(reply, gen, render_before, gen_before, render, handler):
    """The count call went to the render server's `handler`, not to the generation server."""
    assert render.http_requests(handler) > render_before, (handler, reply.describe())
    assert gen.http_requests("/tokenize") == gen_before["/tokenize"]
    assert gen.http_requests("/v1/messages/count_tokens") == gen_before["count_tokens"]


def snapshot(gen):
    return {"/tokenize": gen.http_requests("/tokenize"),
            "count_tokens": gen.http_requests("/v1/messages/count_tokens")}


@pytest.mark.parametrize("shape", list(CHATS))
def test_chat_count_equals_generation_usage(counted, gen, render, shape):
    body = {"model": MODEL, "messages": CHATS[shape], "max_tokens": 100000,
            "temperature": 0}
    if shape != "plain":
        body["tools"] = TOOLS
    before, gb = render.http_requests("/v1/chat/completions/render"), snapshot(gen)
    # Streamed and closed once the usage arrived: the count is checked, not a generation
    # (the completion and Responses cases below read whole answers).
    reply = counted.post_head(body, "/v1/chat/completions")
    assert reply.status == 200 and reply.action == "rewritten", reply.describe()
    assert reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == head_prompt_tokens(reply.events), reply.describe()
    assert reply.max_tokens_header == WINDOW - reply.prompt_tokens_header
    counts_on_render_only(reply, gen, before, gb, render, "/v1/chat/completions/render")


def test_completion_count_equals_generation_usage(counted, gen, render):
    body = {"model": MODEL, "prompt": "Once upon a time (render completion),",
            "max_tokens": 100000, "temperature": 0}
    before, gb = render.http_requests("/v1/completions/render"), snapshot(gen)
    reply = counted.post(body, "/v1/completions")
    assert reply.status == 200 and reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == reply.usage["prompt_tokens"], reply.describe()
    counts_on_render_only(reply, gen, before, gb, render, "/v1/completions/render")


@pytest.mark.parametrize("shape", list(ANTHROPIC))
def test_anthropic_count_equals_generation_usage(counted, gen, render, shape):
    body = {"model": MODEL, "max_tokens": 32000, **ANTHROPIC[shape]}
    before, gb = render.http_requests("/v1/messages/render"), snapshot(gen)
    reply = counted.post_head(body, "/v1/messages")
    assert reply.status == 200 and reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == head_prompt_tokens(reply.events), reply.describe()
    assert reply.max_tokens_header == WINDOW - reply.prompt_tokens_header
    counts_on_render_only(reply, gen, before, gb, render, "/v1/messages/render")


def test_responses_count_equals_generation_usage(counted, gen, render):
    body = {"model": MODEL, "instructions": "You are terse.",
            "tools": [{"type": "function", "name": "get_weather",
                       "description": "Weather for a city.",
                       "parameters": {"type": "object",
                                      "properties": {"city": {"type": "string"}}}}],
            "input": [{"role": "user", "content": "Weather in Paris? (render responses)"}],
            "max_output_tokens": 100000, "temperature": 0}
    before, gb = render.http_requests("/v1/responses/render"), snapshot(gen)
    reply = counted.post(body, "/v1/responses")
    assert reply.status == 200 and reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == reply.json()["usage"]["input_tokens"], reply.describe()
    counts_on_render_only(reply, gen, before, gb, render, "/v1/responses/render")


def test_generation_server_without_scale_out_is_a_counted_failure(envoys, gen):
    """vLLM serve answers its render API 403 without --enable-scale-out: the estimate."""
    body = {"model": MODEL, "messages": [user("Say hello (render 403).")],
            "max_tokens": 100000, "temperature": 0}
    direct = httpx.post(gen.url + "/v1/chat/completions/render",
                        json={k: v for k, v in body.items() if k != "max_tokens"}, timeout=30)
    assert direct.status_code == 403, (direct.status_code, direct.text[:200])
    # With the window configured, the estimate budgets the request.
    client = envoys.client("no-scale-out", gen.port, context_length=WINDOW)
    reply = client.post_head(body, "/v1/chat/completions")
    assert reply.status == 200 and reply.action == "rewritten", reply.describe()
    assert reply.source == "estimate", reply.describe()
    assert reply.delta.get("incontext_tokenizer_failures_status") == 1, reply.delta
    assert reply.max_tokens_header == WINDOW - reply.prompt_tokens_header - F
    # Without it, the window comes from that server's own /v1/models entry; the count's 403
    # still leaves the estimate.
    learned = envoys.client("no-scale-out-learned", gen.port)
    reply = learned.post_head(body, "/v1/chat/completions")
    assert reply.status == 200 and reply.action == "rewritten", reply.describe()
    assert reply.source == "estimate", reply.describe()
    assert reply.delta.get("incontext_tokenizer_failures_status") == 1, reply.delta
    assert reply.delta.get("incontext_tokenizer_calls") == 2, reply.delta
    assert reply.max_tokens_header == WINDOW - reply.prompt_tokens_header - F
