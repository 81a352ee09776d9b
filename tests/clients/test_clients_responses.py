"""/v1/responses through Envoy + incontext: not budgeted (its `input` is neither a chat nor a
completion body), reported as unchanged with a reason, and answered by vLLM exactly as when
the SDK talks to vLLM directly — streaming included, and the oversized cap that vLLM refuses
is refused the same way."""

import openai
import pytest

from tests.clients.stack import BIG, C, MODEL, incontext


def sdk(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=180)


INPUTS = {
    "text": "Say hello to the reader of this sentence, politely.",
    "items": [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": "Say hello to the reader, politely."}],
}


def assert_unchanged(headers):
    h = incontext(headers)
    assert (h.get("x-incontext-action") or "").startswith("unchanged:"), h
    assert "x-incontext-max-tokens" not in h, h


@pytest.mark.parametrize("shape", sorted(INPUTS))
def test_responses_pass_through(vllm, envoy, shape):
    def call(url):
        raw = sdk(url).responses.with_raw_response.create(
            model=MODEL, input=INPUTS[shape], max_output_tokens=16, temperature=0)
        return raw.headers, raw.parse()

    _, direct = call(vllm.url)
    headers, via = call(envoy.url)
    assert_unchanged(headers)
    assert via.output_text == direct.output_text
    assert via.usage.input_tokens == direct.usage.input_tokens
    assert via.usage.output_tokens == direct.usage.output_tokens <= 16
    assert via.status == direct.status


def test_responses_stream_pass_through(vllm, envoy):
    def call(url):
        with sdk(url).responses.with_streaming_response.create(
                model=MODEL, input=INPUTS["items"], max_output_tokens=16, temperature=0,
                stream=True) as resp:
            return resp.headers, list(resp.parse())

    _, direct = call(vllm.url)
    headers, via = call(envoy.url)
    assert_unchanged(headers)
    # the same events (text deltas may be split differently from one generation to the next)
    delta = "response.output_text.delta"
    assert [e.type for e in via if e.type != delta] == [e.type for e in direct if e.type != delta]
    assert "".join(e.delta for e in via if e.type == delta) == \
        "".join(e.delta for e in direct if e.type == delta)
    assert via[-1].response.usage.input_tokens == direct[-1].response.usage.input_tokens
    assert via[-1].response.usage.output_tokens == direct[-1].response.usage.output_tokens


def test_responses_oversized_cap_is_left_to_vllm(vllm, envoy):
    """Not budgeted: vLLM refuses max_output_tokens above its window, through Envoy too."""
    errors = []
    for url in (vllm.url, envoy.url):
        with pytest.raises(openai.BadRequestError) as e:
            sdk(url).responses.create(model=MODEL, input=INPUTS["text"],
                                      max_output_tokens=BIG)
        errors.append(e.value)
    direct, via = errors
    assert f"max_output_tokens={BIG} cannot be greater than max_model_len={C}" in str(direct)
    assert str(via) == str(direct)
    assert_unchanged(via.response.headers)
