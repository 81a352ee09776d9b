"""Envoy + incontext with the llamacpp tokenizer backend in front of the real llama-server.

The plugin configuration names no context_length: the filter learns the window C from
GET /props (default_generation_settings.n_ctx). For each dialect an oversized cap must be
rewritten to C - P, where P is the count of the backend's own endpoint for that dialect, and
P must equal the prompt the server itself reports in the response's usage.
"""

import json

import pytest

from tests.llamacpp.cases import ANTHROPIC, CHAT, COMPLETIONS, with_cap
from tests.llamacpp.stack import MODEL, anthropic_prompt_tokens


def check_rewritten(r, prompt_tokens: int, n_ctx: int):
    assert r.status == 200, r.describe()
    assert r.h("x-incontext-action") == "rewritten", r.describe()
    assert r.h("x-incontext-source") == "exact", r.describe()
    assert r.int_header("x-incontext-prompt-tokens") == prompt_tokens, r.describe()
    assert r.int_header("x-incontext-max-tokens") == n_ctx - prompt_tokens, r.describe()


@pytest.mark.parametrize("case", list(CHAT))
def test_chat_cap_rewritten_to_the_learned_window(proxy, llama, case):
    n_ctx = llama.n_ctx()
    r = proxy.post("/v1/chat/completions", with_cap(CHAT[case], 32768, temperature=0))
    assert r.status == 200, r.describe()
    usage = r.json()["usage"]
    check_rewritten(r, usage["prompt_tokens"], n_ctx)
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= n_ctx, usage


@pytest.mark.parametrize("case", list(ANTHROPIC))
def test_anthropic_cap_rewritten_to_the_learned_window(proxy, llama, case):
    n_ctx = llama.n_ctx()
    r = proxy.post("/v1/messages", with_cap(ANTHROPIC[case], 32000, temperature=0))
    assert r.status == 200, r.describe()
    usage = r.json()["usage"]
    prompt = anthropic_prompt_tokens(usage)
    check_rewritten(r, prompt, n_ctx)
    assert prompt + usage["output_tokens"] <= n_ctx, usage


@pytest.mark.parametrize("case", list(COMPLETIONS))
def test_completions_cap_rewritten_to_the_learned_window(proxy, llama, case):
    n_ctx = llama.n_ctx()
    prompt = COMPLETIONS[case]
    r = proxy.post("/v1/completions",
                   {"model": MODEL, "prompt": prompt, "max_tokens": 32768, "temperature": 0})
    assert r.status == 200, r.describe()
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == len(llama.tokenize(prompt)), usage
    check_rewritten(r, usage["prompt_tokens"], n_ctx)
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= n_ctx, usage


RESPONSES = {
    "text": {"model": MODEL, "input": "Say hello to the reader, politely."},
    "items": {"model": MODEL, "instructions": "You are terse.",
              "input": [{"role": "user", "content": "Say hello to the reader, politely."}]},
    "stream-no-cap": {"model": MODEL, "input": [{"role": "user", "content": "Count to three."}],
                      "stream": True, "store": False},
}


@pytest.mark.parametrize("case", list(RESPONSES))
def test_responses_cap_rewritten_to_the_learned_window(proxy, llama, case):
    """Counted by llama.cpp's /v1/responses/input_tokens (docs/spec.md §14); the count must
    equal the server's usage.input_tokens."""
    n_ctx = llama.n_ctx()
    body = dict(RESPONSES[case], temperature=0)
    if not body.get("stream"):
        body["max_output_tokens"] = 32768
    r = proxy.post("/v1/responses", body)
    assert r.status == 200, r.describe()
    if body.get("stream"):
        events = [json.loads(line[6:]) for line in r.resp.text.splitlines()
                  if line.startswith("data: ") and line[6:].strip() != "[DONE]"]
        done = [e for e in events if e.get("type") == "response.completed"]
        assert done, r.resp.text[-300:]
        usage = done[-1]["response"]["usage"]
    else:
        usage = r.json()["usage"]
    check_rewritten(r, usage["input_tokens"], n_ctx)
    assert usage["input_tokens"] + usage["output_tokens"] <= n_ctx, usage
