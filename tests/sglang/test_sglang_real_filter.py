"""Envoy + incontext (`sglang` backend) in front of the real SGLang server.

SGLang refuses a cap above its context length (`max_completion_tokens is too large`) and
input + cap above it (`Requested token count exceeds ...`). Through the filter the same
requests are served: the cap is rewritten to C - P, where P is SGLang's own count (equal to
its `usage`) and C is the context length SGLang reports in `GET /v1/models` — not the
`max_model_len` of its `/tokenize` reply, which is the tokenizer's limit.

Here SGLang runs on CPU (scripts/sglang.sh) and generates slowly, so prompts are sized
close to the window and each rewritten request generates C - P ≈ 70 tokens. With
INCONTEXT_SGLANG_URL the same tests run against an SGLang running elsewhere (docs/backends.md).
"""

import json
import uuid

import pytest

from tests.sglang.stack import COUNT_LOG, R, fit

TARGET_MARGIN = R + 4   # prompts sized to C - TARGET_MARGIN tokens


def big_cap(c: int, usual: int = 32768) -> int:
    """A cap above the window: 32768 here (C = 512); twice C on a server with a larger one."""
    return max(usual, 2 * c)

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Full-text search in the manual.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather for a city.",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture(scope="module")
def window(sglang):
    """C and the tokenizer limit, as the server itself reports them (the test oracle)."""
    c = sglang.window()
    t = sglang.tokenizer_limit()
    assert c != t, (f"SGLang reports the same limit in /v1/models and /tokenize ({c}); "
                    "the test cannot tell which one the filter used")
    return c, t


@pytest.fixture
def client(sglang, envoys):
    return envoys.client(sglang, "real")


def nonce() -> str:
    return uuid.uuid4().hex[:8]


def assert_rewritten(reply, window, prompt_tokens: int, shape: str):
    c, tokenizer_limit = window
    COUNT_LOG.append(("sglang", shape, reply.prompt_tokens_header, prompt_tokens))
    assert reply.status == 200, reply.describe()
    assert reply.action == "rewritten", reply.describe()
    assert reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == prompt_tokens, reply.describe()
    assert reply.max_tokens_header == c - prompt_tokens, reply.describe()
    assert reply.max_tokens_header != tokenizer_limit - prompt_tokens, (
        "the window came from /tokenize's max_model_len: " + reply.describe())


def test_sglang_real_refuses_oversized_cap_without_the_filter(sglang, window):
    c, _ = window
    body = {"model": sglang.model, "messages": [SYSTEM, {"role": "user", "content": "Hi"}],
            "max_tokens": big_cap(c)}
    r = sglang.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["object"] == "error"
    body["max_tokens"] = c   # within the context length, but input + cap is not
    r = sglang.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:300]
    assert "maximum context length" in r.json()["message"]


TOOL_CALL = {"role": "assistant", "content": "",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": json.dumps({"city": "Köln", "unit": "c"})}}]}


def chat_plain(n, filler):
    return {"messages": [SYSTEM, {"role": "user", "content": f"Summarise ({n}):{filler}"}]}


def chat_tools(n, filler):
    return {"tools": TOOLS,
            "messages": [SYSTEM, {"role": "user", "content": f"Weather in Köln? ({n})"},
                         TOOL_CALL,
                         {"role": "tool", "tool_call_id": "call_1",
                          "content": json.dumps({"temp": 21, "sky": "clear"})},
                         {"role": "user", "content": f"And tomorrow?{filler}"}]}


def chat_template_kwargs(n, filler):
    # Qwen3's template closes an empty think block when enable_thinking is false.
    return {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False},
            "messages": [{"role": "user", "content": f"Quick answer ({n}):{filler}"}]}


def chat_tool_choice_none(n, filler):
    # SGLang leaves the tools out of the prompt when tool_choice is "none" (its /tokenize
    # does the same when it is given the tool_choice).
    return {"tools": TOOLS, "tool_choice": "none",
            "messages": [SYSTEM, {"role": "user", "content": f"No tools ({n}):{filler}"}]}


# shape -> (body builder, Envoy name, plugin configuration changes)
CHAT_SHAPES = {
    "plain": (chat_plain, "real", {}),
    "tools + tool history": (chat_tools, "real", {}),
    "reasoning_effort + chat_template_kwargs": (chat_template_kwargs, "real", {}),
    "tool_choice none": (chat_tool_choice_none, "real", {}),
}


@pytest.mark.parametrize("shape", list(CHAT_SHAPES))
def test_sglang_real_chat(shape, sglang, envoys, window):
    """Chat with max_tokens 32768 (SGLang alone: 400) is rewritten to C - P with SGLang's own
    count, C from /v1/models."""
    c, _ = window
    build_shape, envoy_name, changes = CHAT_SHAPES[shape]
    client = envoys.client(sglang, envoy_name, **changes)
    n = nonce()

    def build(filler):
        return {"model": sglang.model, "max_tokens": big_cap(c), **build_shape(n, filler)}

    body = fit(sglang.count_chat, build, c - TARGET_MARGIN)
    reply = client.post(body)
    assert_rewritten(reply, window, reply.usage["prompt_tokens"] if reply.status == 200 else -1,
                     f"chat {shape}")
    usage = reply.usage
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= c


def test_sglang_real_completions_string_prompt(sglang, client, window):
    c, _ = window
    n = nonce()

    def build(filler):
        return {"model": sglang.model, "max_tokens": big_cap(c),
                "prompt": f"Continue the list ({n}):{filler}"}

    body = fit(lambda b: sglang.count_prompt(b["prompt"]), build, c - TARGET_MARGIN)
    reply = client.post(body, path="/v1/completions")
    assert_rewritten(reply, window, reply.usage["prompt_tokens"] if reply.status == 200 else -1,
                     "completions string prompt")


def test_sglang_real_messages_counted_by_count_tokens(sglang, client, window):
    c, _ = window
    n = nonce()

    def build(filler):
        return {"model": sglang.model, "max_tokens": big_cap(c, 32000), "system": "Be terse.",
                "tools": ANTHROPIC_TOOLS,
                "messages": [{"role": "user",
                              "content": [{"type": "text",
                                           "text": f"Weather in Köln? ({n}){filler}"}]}]}

    body = fit(sglang.count_anthropic, build, c - TARGET_MARGIN)
    reply = client.post(body, path="/v1/messages")
    prompt = reply.json()["usage"]["input_tokens"] if reply.status == 200 else -1
    assert_rewritten(reply, window, prompt, "anthropic messages")
