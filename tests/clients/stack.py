"""Shared pieces of the client suite: the real vLLM and Envoy + incontext (tests/vllm's stack),
prompt sizing for both dialects, and the header checks every test makes.

The clients are the official `openai` and `anthropic` SDKs and LiteLLM, used as an agent uses
them: pointed at Envoy's address, nothing patched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional, Tuple

# LiteLLM fetches its model price list from the internet at import unless told to use the copy
# it ships; the tests reach loopback only.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

import httpx  # noqa: E402
import pytest  # noqa: E402

from tests.harness.envoy import Envoy, envoy_binary, no_filter  # noqa: E402
from tests.vllm.stack import (C, F, MODEL, R, StackError, Vllm, fit_messages,  # noqa: E402,F401
                              plugin_config)

FILLER = " a"   # one Qwen3 token per repetition
BIG = 32768     # the output cap agents send, far above the 512-token window

# Two OpenAI tools and a conversation that has called both (for the chat tests).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                       "required": ["tz"]}}},
]


def tool_history(nonce: str) -> Callable[[str], list]:
    """``build(filler)`` for fit_chat: the conversation, unique per ``nonce`` (each test its
    own prompt, so none is counted from another's cache entry)."""
    return lambda filler: [
        {"role": "system", "content": "You answer with the tools when you can."},
        {"role": "user", "content": "Weather in Paris, and the time in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": json.dumps({"tz": "Asia/Tokyo"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, light rain"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21:04"},
        {"role": "user", "content": f"Now compare both and explain ({nonce}):{filler}"},
    ]


class Stack:
    """Envoys in front of one vLLM, one per named plugin configuration (tests/vllm's base
    configuration plus ``changes``), started on first use."""

    def __init__(self, vllm: Vllm, workdir: Path):
        self.vllm = vllm
        self.workdir = workdir
        self.envoys = {}

    def envoy(self, name: str, *, extra_clusters=(), **changes) -> Envoy:
        env = self.envoys.get(name)
        if env is not None and env.alive():
            return env
        binary = envoy_binary()
        if not binary:
            pytest.fail("Envoy binary not found: run scripts/setup.sh (or set ENVOY_BIN)",
                        pytrace=False)
        cfg = plugin_config(self.vllm.port, **changes)
        try:
            env = Envoy(binary, self.workdir, cfg, ("127.0.0.1", self.vllm.port),
                        remove_filter=no_filter(), extra_clusters=extra_clusters,
                        name=f"envoy-{name}").start()
        except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the test
            pytest.fail(f"Envoy ({name}) could not be started: {e}", pytrace=False)
        self.envoys[name] = env
        return env

    def stop(self):
        for env in self.envoys.values():
            env.stop()


def fit_chat(vllm: Vllm, target: int, build: Callable[[str], list], **extra) -> Tuple[list, int]:
    """Chat messages (``build(filler)``) whose prompt, rendered with ``extra`` (e.g. tools),
    is exactly ``target`` tokens by vLLM's own /tokenize."""
    base = vllm.count_chat(build(""), **extra)
    if base > target:
        raise StackError(f"the prompt without filler has {base} tokens > {target}")
    n, got = target - base, base
    for _ in range(8):
        msgs = build(FILLER * n)
        got = vllm.count_chat(msgs, **extra)
        if got == target:
            return msgs, got
        n += target - got
        if n < 0:
            break
    raise StackError(f"could not size a prompt to {target} tokens (last {got})")


def count_anthropic(vllm: Vllm, request: dict) -> int:
    """vLLM's own Anthropic count of ``request`` (its /v1/messages/count_tokens)."""
    body = {k: v for k, v in request.items() if k not in ("max_tokens", "stream")}
    body.setdefault("model", MODEL)
    r = httpx.post(vllm.url + "/v1/messages/count_tokens", json=body, timeout=60)
    if r.status_code != 200:
        raise StackError(f"/v1/messages/count_tokens answered {r.status_code}: {r.text[:300]}")
    return r.json()["input_tokens"]


def fit_anthropic(vllm: Vllm, target: int, build: Callable[[str], dict]) -> Tuple[dict, int]:
    """An Anthropic request (``build(filler)`` -> system/messages/tools) whose input is exactly
    ``target`` tokens by vLLM's own counter."""
    base = count_anthropic(vllm, build(""))
    if base > target:
        raise StackError(f"the request without filler has {base} tokens > {target}")
    n = target - base
    got = base
    for _ in range(8):
        req = build(FILLER * n)
        got = count_anthropic(vllm, req)
        if got == target:
            return req, got
        n += target - got
        if n < 0:
            break
    raise StackError(f"could not size an Anthropic request to {target} tokens (last {got})")


def incontext(headers) -> dict:
    """The x-incontext-* response headers (lower-case names)."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-incontext-")}


def int_header(headers, name: str) -> Optional[int]:
    v = headers.get(name)
    return int(v) if v is not None else None


def assert_rewritten_exact(headers, prompt_tokens: int, what=""):
    """The filter counted exactly, rewrote the cap to the rest of the window."""
    h = incontext(headers)
    assert h.get("x-incontext-action") == "rewritten", (what, h)
    assert h.get("x-incontext-source") == "exact", (what, h)
    assert int_header(headers, "x-incontext-prompt-tokens") == prompt_tokens, (what, h)
    assert int_header(headers, "x-incontext-max-tokens") == C - prompt_tokens, (what, h)


# --- Anthropic Messages ------------------------------------------------------------------
# Two Anthropic tools and a conversation that has used both (tool_use / tool_result blocks).
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "input_schema": {"type": "object", "properties": {
         "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
         "required": ["city"]}},
    {"name": "get_time", "description": "Local time in a time zone.",
     "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}},
                      "required": ["tz"]}},
]


def input_tokens(usage) -> int:
    """All the prompt tokens of an Anthropic usage object (SDK object or dict): vLLM reports
    the part served from its prefix cache apart, as cache_read_input_tokens."""
    get = usage.get if isinstance(usage, dict) else (lambda k: getattr(usage, k, None))
    return get("input_tokens") + (get("cache_read_input_tokens") or 0)


def anthropic_tool_history(filler: str) -> list:
    return [
        {"role": "user", "content": "Weather in Paris, and the time in Tokyo?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
             "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_02", "name": "get_time",
             "input": {"tz": "Asia/Tokyo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C, light rain"},
            {"type": "tool_result", "tool_use_id": "toolu_02",
             "content": [{"type": "text", "text": "21:04"}]},
            {"type": "text", "text": f"Now compare both and explain:{filler}"}]},
    ]
