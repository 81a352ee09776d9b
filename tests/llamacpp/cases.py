"""The request shapes the llama.cpp suites send: OpenAI chat, completions and Anthropic messages.

Bodies carry no max_tokens; each test adds the cap it needs.
"""

from __future__ import annotations

import json

from tests.harness.cases import SYSTEM, SYSTEM_TEXT, TOOLS, assistant, user
from tests.llamacpp.stack import MODEL




TOOL_HISTORY = [
    SYSTEM,
    user("What's the weather in Köln, and is there a manual page about umbrellas?"),
    {"role": "assistant", "content": "",
     "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather",
                       "arguments": json.dumps({"city": "Köln", "unit": "c"})}},
         {"id": "call_2", "type": "function",
          "function": {"name": "search_docs", "arguments": json.dumps({"query": "umbrella"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": 21, "sky": "rain"})},
    {"role": "tool", "tool_call_id": "call_2", "content": "Umbrellas: see chapter 7."},
    user("Summarise that in one sentence."),
]

MULTI_TURN = [
    SYSTEM,
    user("Hi!"), assistant("Hello! How can I help?"),
    user("Name three rivers."), assistant("Rhine, Danube, Elbe."),
    user("And their lengths? Grüße, 你好 🚀"),
]

# case id -> OpenAI chat body without a cap
CHAT = {
    "user-only": {"model": MODEL, "messages": [user("Hello there, how are you today?")]},
    "system+user": {"model": MODEL, "messages": [SYSTEM, user("Name a colour.")]},
    "tools+tool-history": {"model": MODEL, "messages": TOOL_HISTORY, "tools": TOOLS},
    "multi-turn": {"model": MODEL, "messages": MULTI_TURN},
    # the template renders an empty think block: four more tokens, counted only if the count
    # call gets the request's chat_template_kwargs
    "thinking-off": {"model": MODEL, "messages": [SYSTEM, user("Name a colour.")],
                     "chat_template_kwargs": {"enable_thinking": False}},
}

# case id -> completions prompt string
COMPLETIONS = {
    "plain": "The quick brown fox jumps over the lazy dog. Once upon a time",
    "non-ascii": "Grüße aus Köln: café, naïve — 你好，世界！これは日本語です。🚀🎉",
    "special-token-text": "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
}

ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "input_schema": {"type": "object",
                      "properties": {"city": {"type": "string"},
                                     "unit": {"type": "string", "enum": ["c", "f"]}},
                      "required": ["city"]}},
    {"name": "search_docs", "description": "Full-text search in the manual.",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                      "required": ["query"]}},
]

# case id -> Anthropic messages body without a cap
ANTHROPIC = {
    "system-string": {
        "model": MODEL, "system": SYSTEM_TEXT,
        "messages": [{"role": "user", "content": "Name a colour."}]},
    "system-blocks": {
        "model": MODEL,
        "system": [{"type": "text", "text": SYSTEM_TEXT},
                   {"type": "text", "text": "Never use more than ten words."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a river."}]}]},
    "tools+tool-history": {
        "model": MODEL, "system": SYSTEM_TEXT, "tools": ANTHROPIC_TOOLS,
        "messages": [
            {"role": "user", "content": "What's the weather in Köln?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Köln", "unit": "c"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": json.dumps({"temp": 21, "sky": "rain"})},
                {"type": "text", "text": "Summarise that in one sentence."}]},
        ]},
    "multi-turn": {
        "model": MODEL, "system": SYSTEM_TEXT,
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name three rivers. Grüße, 你好 🚀"}]},
}


def with_cap(body: dict, cap: int, **extra) -> dict:
    out = dict(body)
    out["max_tokens"] = cap
    out.update(extra)
    return out
