"""Envoy + incontext (`sglang` backend) in front of a stub SGLang (fake_sglang.py) whose
count and window endpoints can be switched to answer in the wrong shape — which the real
server never does, hence a stub. A wrong shape is a tokenizer failure: the filter estimates
(source `estimate`) and the request is served; never a 5xx.

First the stub is held to the real SGLang: same reply keys and the same counts for every
request these tests send, so the stub's "right" answers are SGLang's.
"""

import json
import uuid

import pytest

from tests.sglang.stack import COUNT_LOG, F, MODEL

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
HISTORY = [SYSTEM, {"role": "user", "content": "Weather in Köln?"},
           {"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather",
                                         "arguments": json.dumps({"city": "Köln"})}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": 21})},
           {"role": "user", "content": [{"type": "text", "text": "And"},
                                        {"type": "text", "text": "tomorrow?"}]}]
ANTHROPIC = {"model": MODEL, "system": "Be terse.",
             "tools": [{"name": "get_weather", "description": "w",
                        "input_schema": TOOLS[0]["function"]["parameters"]}],
             "messages": [{"role": "user", "content": "Weather?"},
                          {"role": "assistant", "content": [
                              {"type": "text", "text": "Checking."},
                              {"type": "tool_use", "id": "tu1", "name": "get_weather",
                               "input": {"city": "Köln"}}]},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": "tu1", "content": "21C"}]}]}
TOKENIZE_CASES = {
    "plain": {"messages": [SYSTEM, {"role": "user", "content": "Hello there"}]},
    "tools + tool history": {"messages": HISTORY, "tools": TOOLS},
    "reasoning_effort + chat_template_kwargs": {
        "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False}},
    "tool_choice none": {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS,
                         "tool_choice": "none"},
    "prompt": {"prompt": "Once upon a time, in Köln,"},
}


def nonce() -> str:
    return uuid.uuid4().hex[:8]


def shape(v):
    """The JSON structure of a reply: keys and value types, not values."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    return type(v).__name__


def _ids(r):
    return {k: v for k, v in r.items() if k not in ("id", "created")}


# --- the stub is SGLang's shape --------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(TOKENIZE_CASES))
def test_stub_tokenize_matches_real_sglang(case, sglang, stub):
    body = dict(TOKENIZE_CASES[case], model=MODEL)
    real = sglang.post("/tokenize", body)
    fake = stub.post("/tokenize", body)
    assert real.status_code == fake.status_code == 200, (real.text[:200], fake.text[:200])
    assert shape(fake.json()) == shape(real.json())
    assert fake.json()["count"] == real.json()["count"]
    assert fake.json()["max_model_len"] == real.json()["max_model_len"]


def test_stub_models_and_count_tokens_match_real_sglang(sglang, stub):
    real, fake = sglang.get("/v1/models").json(), stub.get("/v1/models").json()
    assert shape(fake) == shape(real)
    assert fake["data"][0]["max_model_len"] == real["data"][0]["max_model_len"]
    real = sglang.post("/v1/messages/count_tokens", ANTHROPIC).json()
    fake = stub.post("/v1/messages/count_tokens", ANTHROPIC).json()
    assert fake == real


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": HISTORY, "tools": TOOLS, "max_tokens": 32768}),
    ("/v1/chat/completions", {"messages": HISTORY, "tools": TOOLS, "max_tokens": 500}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 32768}),
    ("/v1/messages", dict(ANTHROPIC, max_tokens=32000)),
], ids=["chat cap > C", "chat input + cap > C", "completions input + cap > C",
        "messages cap > C"])
def test_stub_overflow_errors_match_real_sglang(path, body, sglang, stub):
    body = dict(body, model=MODEL)
    real, fake = sglang.post(path, body), stub.post(path, body)
    assert real.status_code == fake.status_code == 400, (real.text[:200], fake.text[:200])
    assert fake.json() == real.json()


def test_stub_usage_shapes_match_real_sglang(sglang, stub):
    for path, body in [
            ("/v1/chat/completions", {"messages": HISTORY, "tools": TOOLS, "max_tokens": 2}),
            ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 2}),
            ("/v1/messages", dict(ANTHROPIC, max_tokens=2))]:
        body = dict(body, model=MODEL)
        real, fake = sglang.post(path, body), stub.post(path, body)
        assert real.status_code == fake.status_code == 200, (real.text[:200], fake.text[:200])
        r, f = real.json(), fake.json()
        assert set(f) <= set(r), (path, sorted(set(f) - set(r)))
        assert shape(f["usage"]) == shape(r["usage"])
        assert f["usage"] == r["usage"], path


# --- through the filter ------------------------------------------------------------------------
@pytest.fixture
def faulty(stub):
    yield stub
    stub.set_fault("none")


def chat_body(n):
    return {"model": MODEL, "max_tokens": 32768, "tools": TOOLS,
            "messages": HISTORY[:-1] + [{"role": "user", "content": f"And tomorrow? ({n})"}]}


def test_stub_exact_while_the_replies_are_right(stub, envoys):
    c = stub.window()
    client = envoys.client(stub, "stub")
    reply = client.post(chat_body(nonce()))
    p = reply.json()["usage"]["prompt_tokens"] if reply.status == 200 else -1
    COUNT_LOG.append(("stub", "chat tools + tool history", reply.prompt_tokens_header, p))
    assert reply.status == 200, reply.describe()
    assert (reply.action, reply.source) == ("rewritten", "exact"), reply.describe()
    assert reply.prompt_tokens_header == p
    assert reply.max_tokens_header == c - p
    assert stub.calls()["last"]["/v1/chat/completions"]["max_tokens"] == c - p


@pytest.mark.parametrize("fault", ["tokenize-count-string", "tokenize-no-count",
                                   "tokenize-not-json"])
def test_stub_wrong_tokenize_reply_is_an_estimate(fault, faulty, envoys):
    c = faulty.window()
    client = envoys.client(faulty, "stub")
    client.post(chat_body(nonce()))          # the window is learned while replies are right
    faulty.set_fault(fault)
    before = faulty.calls()["calls"].get("/tokenize", 0)
    reply = client.post(chat_body(nonce()))
    assert faulty.calls()["calls"].get("/tokenize", 0) > before, "the filter did not count"
    # Served by the stub: 200, or the stub's own 400 if the rough estimate fell short.
    assert reply.status < 500, reply.describe()
    assert reply.source == "estimate", reply.describe()
    assert reply.action == "rewritten", reply.describe()
    sent = faulty.calls()["last"]["/v1/chat/completions"]["max_tokens"]
    assert sent == reply.max_tokens_header
    # the estimate keeps F in reserve, within the window learned from /v1/models
    assert reply.prompt_tokens_header + sent + F <= c, reply.describe()


def test_stub_wrong_count_tokens_reply_is_an_estimate(faulty, envoys):
    c = faulty.window()
    client = envoys.client(faulty, "stub")
    faulty.set_fault("count-tokens-shape")
    body = dict(ANTHROPIC, max_tokens=32000,
                messages=ANTHROPIC["messages"] + [{"role": "assistant", "content": "ok"},
                                                  {"role": "user", "content": nonce()}])
    reply = client.post(body, path="/v1/messages")
    assert faulty.calls()["calls"].get("/v1/messages/count_tokens", 0) > 0
    assert reply.status < 500, reply.describe()
    assert reply.source == "estimate", reply.describe()
    sent = faulty.calls()["last"]["/v1/messages"]["max_tokens"]
    assert sent == reply.max_tokens_header
    assert reply.prompt_tokens_header + sent + F <= c, reply.describe()


def test_stub_wrong_models_reply_never_a_5xx(faulty, envoys):
    """No window can be learned: the request passes unchanged (SGLang answers it) and the
    filter never falls back to /tokenize's max_model_len."""
    faulty.set_fault("models-shape")
    client = envoys.client(faulty, "stub-no-window")
    reply = client.post(chat_body(nonce()))
    assert reply.status < 500, reply.describe()
    assert reply.action != "rewritten", reply.describe()
    assert faulty.calls()["last"]["/v1/chat/completions"]["max_tokens"] == 32768
    assert client.envoy.alive()
