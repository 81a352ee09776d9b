"""Message and tool shapes shared by the real-server suites (vLLM, llama.cpp, ...)."""

from __future__ import annotations

SYSTEM_TEXT = "You are a terse assistant. Answer in one line."
SYSTEM = {"role": "system", "content": SYSTEM_TEXT}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "description": "City name"},
                                      "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs",
        "description": "Full-text search in the manual.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}
