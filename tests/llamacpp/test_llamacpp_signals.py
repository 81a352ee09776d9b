"""The window-full signal (docs/spec.md §13) against the real llama-server: a prompt longer than
the slot's context gets llama.cpp's `exceed_context_size_error`; through Envoy + incontext the
official SDKs raise their own signal instead (openai: `context_length_exceeded`; anthropic:
"prompt is too long" with the prompt's count and the slot's window). Other errors arrive byte
for byte.
"""

import json

import anthropic
import httpx
import openai
import pytest

from tests.llamacpp.stack import MODEL


def long_text(llama) -> str:
    """A user text well past the slot's context (" a" is about one token)."""
    return "Summarise: " + " a" * (llama.n_ctx() + 200)


def test_openai_chat_gets_context_length_exceeded(proxy, llama):
    msgs = [{"role": "user", "content": long_text(llama)}]
    direct = openai.OpenAI(base_url=llama.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raw:
        direct.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100)
    assert raw.value.body["type"] == "exceed_context_size_error", raw.value.body
    assert raw.value.code != "context_length_exceeded"

    client = openai.OpenAI(base_url=proxy.envoy.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=100)
    assert e.value.code == "context_length_exceeded", e.value.body
    assert e.value.param == "messages"
    n_prompt = raw.value.body["n_prompt_tokens"]
    assert e.value.body["message"] == (
        f"This model's maximum context length is {llama.n_ctx()} tokens. However, your "
        f"messages resulted in {n_prompt} tokens. Please reduce the length of the messages.")


def test_anthropic_gets_prompt_is_too_long(proxy, llama):
    msgs = [{"role": "user", "content": long_text(llama)}]
    direct = httpx.post(llama.url + "/v1/messages",
                        json={"model": MODEL, "max_tokens": 100, "messages": msgs}, timeout=60)
    assert direct.status_code == 400, direct.text[:300]
    n_prompt = direct.json()["error"]["n_prompt_tokens"]

    client = anthropic.Anthropic(base_url=proxy.envoy.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=100, messages=msgs)
    assert e.value.body["error"]["type"] == "invalid_request_error", e.value.body
    assert e.value.body["error"]["message"] == (
        f"prompt is too long: {n_prompt} tokens > {llama.n_ctx()} maximum"), e.value.body


def test_other_errors_arrive_byte_for_byte(proxy, llama):
    bodies = [
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
         "n_probs": "many"},
        {"model": MODEL, "messages": "not a list", "max_tokens": 10},
    ]
    for body in bodies:
        raw = json.dumps(body).encode()
        straight = httpx.post(llama.url + "/v1/chat/completions", content=raw,
                              headers={"content-type": "application/json"}, timeout=60)
        through = httpx.post(proxy.envoy.url + "/v1/chat/completions", content=raw,
                             headers={"content-type": "application/json"}, timeout=60)
        assert straight.status_code >= 400, (body, straight.text[:200])
        assert (through.status_code, through.content) == (straight.status_code,
                                                          straight.content), body
