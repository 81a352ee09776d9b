"""The official OpenAI SDK pointed at Envoy + incontext in front of the real vLLM 0.32.

Each request asks for far more output than the 512-token window holds, as agents do. Straight
to vLLM 0.32 the SDK raises BadRequestError ("... cannot be greater than max_model_len=512");
through Envoy the same call succeeds, the filter's count equals vLLM's usage.prompt_tokens and
prompt + completion fits the window.
"""

import openai
import pytest

from tests.clients.stack import (BIG, C, MODEL, TOOLS, assert_rewritten_exact, fit_chat,
                                fit_messages, int_header, tool_history)



def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=180)


def chat_near_window(vllm, nonce, target=440):
    def build(filler):
        return [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]
    return fit_messages(vllm, target, build)


def assert_vllm_refuses(vllm, call, field):
    """The same call straight to vLLM: vLLM 0.32 refuses a cap above max_model_len."""
    with pytest.raises(openai.BadRequestError) as e:
        call(sdk(vllm.url))
    assert e.value.status_code == 400
    assert f"{field}={BIG} cannot be greater than max_model_len={C}" in str(e.value), str(e.value)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_with_a_cap_of_32768(vllm, envoy, field):
    msgs, p = chat_near_window(vllm, f"openai-{field}")

    def call(client):
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, temperature=0, **{field: BIG})

    assert_vllm_refuses(vllm, call, field)
    raw = call(sdk(envoy.url))
    done = raw.parse()
    assert_rewritten_exact(raw.headers, p, field)
    assert done.usage.prompt_tokens == p
    assert done.usage.prompt_tokens + done.usage.completion_tokens <= C, done.usage
    assert done.choices[0].finish_reason in ("stop", "length")


def test_streaming_usage_matches_the_header(vllm, envoy):
    msgs, p = chat_near_window(vllm, "openai-stream")

    def call(client):
        return client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=msgs, max_tokens=BIG, temperature=0, stream=True,
            stream_options={"include_usage": True})

    with pytest.raises(openai.BadRequestError) as e:
        with call(sdk(vllm.url)):
            pass
    assert f"max_tokens={BIG} cannot be greater than max_model_len={C}" in str(e.value)

    with call(sdk(envoy.url)) as resp:
        headers = resp.headers
        chunks = list(resp.parse())
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1, f"{len(usage)} usage chunks"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text, "the stream carried no text"
    assert int_header(headers, "x-incontext-prompt-tokens") == usage[0].prompt_tokens == p
    assert_rewritten_exact(headers, p, "stream")
    assert usage[0].prompt_tokens + usage[0].completion_tokens <= C, usage[0]


def test_two_tools_and_a_tool_call_history(vllm, envoy):
    # the tools render into the prompt too
    msgs, p = fit_chat(vllm, 440, tool_history("openai-tools"), tools=TOOLS)

    def call(client):
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, tools=TOOLS, max_tokens=BIG, temperature=0)

    assert_vllm_refuses(vllm, call, "max_tokens")
    raw = call(sdk(envoy.url))
    done = raw.parse()
    assert_rewritten_exact(raw.headers, p, "tools")
    assert done.usage.prompt_tokens == p
    assert done.usage.prompt_tokens + done.usage.completion_tokens <= C


def test_n_2_each_choice_fits(vllm, envoy):
    msgs, p = chat_near_window(vllm, "openai-n2")

    def call(client):
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, n=2, max_tokens=BIG, temperature=0.8, logprobs=True)

    assert_vllm_refuses(vllm, call, "max_tokens")
    raw = call(sdk(envoy.url))
    done = raw.parse()
    assert_rewritten_exact(raw.headers, p, "n=2")
    assert len(done.choices) == 2
    per_choice = [len(ch.logprobs.content) for ch in done.choices]
    assert all(0 < n <= C - p for n in per_choice), (per_choice, C - p)
    assert done.usage.completion_tokens == sum(per_choice), (done.usage, per_choice)
    assert done.usage.prompt_tokens == p


def test_legacy_completions(vllm, envoy):
    prompt = "Once upon a time (openai)" + " a" * 420
    p = vllm.tokenize({"model": MODEL, "prompt": prompt})["count"]

    def call(client):
        return client.completions.with_raw_response.create(
            model=MODEL, prompt=prompt, max_tokens=BIG, temperature=0)

    assert_vllm_refuses(vllm, call, "max_tokens")
    raw = call(sdk(envoy.url))
    done = raw.parse()
    assert_rewritten_exact(raw.headers, p, "completions")
    assert done.usage.prompt_tokens == p
    assert done.usage.prompt_tokens + done.usage.completion_tokens <= C
