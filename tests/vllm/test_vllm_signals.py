"""The window-full signal (docs/spec.md §13) against the real vLLM 0.32 with a 4096-token window
and `--enable-scale-out` (the render API), through the real Envoy + incontext, read by the
official `anthropic` and `openai` SDKs: the exception type and code each SDK raises straight to
vLLM and through the gateway, the Anthropic stop reason when the window ended the answer, and
non-overflow errors byte for byte.

The module starts its own vLLM (the suite's other server has a 512-token window) and stops it
at the end; if it cannot start, every test here FAILS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.harness.servers import start_or_fail
from tests.vllm.stack import MODEL, Vllm, plugin_config, start_envoy

pytestmark = pytest.mark.newest_vllm_only

WINDOW = 4096
R = 256
F = 64
SYSTEM = "You are a terse assistant."


class SignalsVllm(Vllm):
    def _env(self):
        env = super()._env()
        env["INCONTEXT_VLLM_MAX_MODEL_LEN"] = str(WINDOW)
        return env


@pytest.fixture(scope="module")
def big(vllm_release, tmp_path_factory):
    # For iterating: INCONTEXT_VLLM_4096_STATE + INCONTEXT_VLLM_4096_PORT reuse a server
    # started with `INCONTEXT_VLLM_STATE=dir INCONTEXT_VLLM_MAX_MODEL_LEN=4096
    # scripts/vllm.sh start port --enable-scale-out` (left running).
    state, port = os.environ.get("INCONTEXT_VLLM_4096_STATE"), os.environ.get(
        "INCONTEXT_VLLM_4096_PORT")
    if state and port:
        server = SignalsVllm(Path(state), int(port), release=vllm_release,
                             extra_args=("--enable-scale-out",))
        keep = server.healthy()
    else:
        server = SignalsVllm(tmp_path_factory.mktemp("vllm-4096"), release=vllm_release,
                             extra_args=("--enable-scale-out",))
        keep = False
    start_or_fail(server, f"vLLM {vllm_release} (window {WINDOW}, scale-out)")
    yield server
    if not keep:
        server.stop()


@pytest.fixture(scope="module")
def envoys(big, tmp_path_factory):
    made = {}
    work = tmp_path_factory.mktemp("signals-envoy")

    def get(name, **changes):
        if name not in made:
            cfg = plugin_config(big.port, context_length=None, min_output_tokens=R,
                                fallback_margin_tokens=F, **changes)
            made[name] = start_envoy(work, f"envoy-{name}", big.port, cfg)
        return made[name]

    yield get
    for env in made.values():
        env.stop()


def text_of(tokens: int) -> str:
    """About ``tokens`` Qwen3 tokens (" a" is one)."""
    return "a" + " a" * (tokens - 1)


def anthropic_messages(tokens: int):
    return [{"role": "user", "content": f"Summarise: {text_of(tokens)}"}]


def chat_messages(tokens: int):
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Summarise: {text_of(tokens)}"}]


def http_requests(vllm, handler):
    return vllm.http_requests(handler)


def test_anthropic_prompt_too_long(big, envoys):
    """A conversation past the window: straight to vLLM the SDK sees vLLM's own text (no
    signal); through incontext, Anthropic's "prompt is too long", in both modes."""
    msgs = anthropic_messages(5000)
    direct = anthropic.Anthropic(base_url=big.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as raw:
        direct.messages.create(model=MODEL, max_tokens=32000, messages=msgs,
                                   timeout=120)
    assert "prompt is too long" not in str(raw.value).lower()

    for mode in ("passthrough", "reject"):
        env = envoys(mode, on_insufficient=mode)
        before = http_requests(big, "/v1/messages")
        client = anthropic.Anthropic(base_url=env.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model=MODEL, max_tokens=32000, messages=msgs,
                                   timeout=120)
        err = e.value
        assert err.status_code == 400
        assert err.body["type"] == "error", err.body
        assert err.body["error"]["type"] == "invalid_request_error", err.body
        message = err.body["error"]["message"]
        assert message.startswith("prompt is too long: "), message
        p = int(message.split(": ")[1].split(" tokens")[0])
        assert p > WINDOW, message
        upstream = http_requests(big, "/v1/messages") - before
        assert upstream == (0 if mode == "reject" else 1), (mode, upstream)
        assert e.value.response.headers.get("x-incontext-action") == (
            "rejected" if mode == "reject" else "unchanged:too_long"), mode


def test_openai_chat_context_length_exceeded(big, envoys):
    msgs = chat_messages(5000)
    direct = openai.OpenAI(base_url=big.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raw:
        direct.chat.completions.create(model=MODEL, messages=msgs, max_tokens=32000)
    assert raw.value.code != "context_length_exceeded"

    client = openai.OpenAI(base_url=envoys("passthrough", on_insufficient="passthrough").url
                           + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=32000)
    assert e.value.code == "context_length_exceeded", e.value.body
    assert e.value.param == "messages"
    assert f"maximum context length is {WINDOW} tokens" in e.value.message


def test_openai_responses_context_length_exceeded(big, envoys):
    body = dict(model=MODEL, input=f"Summarise: {text_of(5000)}", max_output_tokens=32000,
                store=False)
    direct = openai.OpenAI(base_url=big.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raw:
        direct.responses.create(**body)
    assert raw.value.code != "context_length_exceeded"
    for mode in ("passthrough", "reject"):
        env = envoys(mode, on_insufficient=mode)
        before = http_requests(big, "/v1/responses")
        client = openai.OpenAI(base_url=env.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**body)
        assert e.value.code == "context_length_exceeded", (mode, e.value.body)
        assert e.value.param == "input", (mode, e.value.body)
        assert http_requests(big, "/v1/responses") - before == (0 if mode == "reject" else 1)


def test_non_overflow_errors_arrive_byte_for_byte(big, envoys):
    env = envoys("passthrough", on_insufficient="passthrough")
    cases = [
        ("/v1/chat/completions", {"model": MODEL, "messages": chat_messages(20),
                                  "max_tokens": 50, "temperature": -1}),
        ("/v1/messages", {"model": MODEL, "max_tokens": 50, "messages": anthropic_messages(20),
                          "top_k": -5}),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": chat_messages(20),
                                  "max_tokens": 50}),
    ]
    for path, body in cases:
        raw = json.dumps(body).encode()
        straight = httpx.post(big.url + path, content=raw,
                              headers={"content-type": "application/json"}, timeout=60)
        through = httpx.post(env.url + path, content=raw,
                             headers={"content-type": "application/json"}, timeout=60)
        assert 400 <= straight.status_code < 500, (path, straight.text[:200])
        assert through.status_code == straight.status_code, (path, through.text[:200])
        assert through.content == straight.content, (path, through.content[:300])


def test_anthropic_stop_reason_when_the_window_ended_the_answer(big, envoys):
    env = envoys("passthrough", on_insufficient="passthrough")
    client = anthropic.Anthropic(base_url=env.url, api_key="x", max_retries=0)
    msgs = anthropic_messages(3700)
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=32000,
                                                   messages=msgs, timeout=300)
    written = int(raw.headers["x-incontext-max-tokens"])
    msg = raw.parse()
    assert msg.usage.input_tokens + written == WINDOW, (msg.usage, written)
    if msg.usage.output_tokens == written:
        assert msg.stop_reason == "model_context_window_exceeded", msg
    else:
        assert msg.stop_reason != "model_context_window_exceeded", msg
    # Streamed: the message_delta carries it.
    with client.messages.stream(model=MODEL, max_tokens=32000, messages=msgs,
                                timeout=300) as stream:
        final = stream.get_final_message()
    if final.usage.output_tokens == written:
        assert final.stop_reason == "model_context_window_exceeded", final
    # At least one of the two was cut by the window (the random-weight model rarely stops).
    assert "model_context_window_exceeded" in (msg.stop_reason, final.stop_reason), (msg, final)
    # The caller's own cap ended it: max_tokens stays.
    own = client.messages.create(model=MODEL, max_tokens=40, messages=msgs)
    if own.usage.output_tokens == 40:
        assert own.stop_reason == "max_tokens", own
