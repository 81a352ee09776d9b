"""One Envoy, one incontext configuration, two models on two real vLLM servers with different
windows (docs/spec.md §16): each model is counted on its own server, budgeted with its own
window, in the OpenAI and Anthropic dialects and in both orders of first use; a model's learned
window never reaches the other; each route's counters count its own requests; a model no route
names passes unchanged (`model`)."""

from __future__ import annotations

import httpx
import pytest

from tests.harness.cases import SYSTEM, TOOLS, user
from tests.harness.envoy import counter_delta
from tests.routes.conftest import MODELS
from tests.vllm.stack import Client, head_prompt_tokens

ORDERS = {
    # Anthropic first: the window comes from each server's /v1/models.
    "a_then_b_anthropic_first": [("tiny-a", "anthropic"), ("tiny-b", "anthropic"),
                                 ("tiny-a", "chat"), ("tiny-b", "chat")],
    # Chat first: the window comes with each server's /tokenize count.
    "b_then_a_chat_first": [("tiny-b", "chat"), ("tiny-a", "chat"),
                            ("tiny-b", "anthropic"), ("tiny-a", "anthropic")],
}


def body(model: str, dialect: str) -> tuple:
    if dialect == "chat":
        return "/v1/chat/completions", {
            "model": model, "messages": [SYSTEM, user(f"Weather in Paris? ({model} chat)")],
            "tools": TOOLS, "max_tokens": 100000, "temperature": 0}
    return "/v1/messages", {
        "model": model, "max_tokens": 32000, "system": "You are terse.",
        "messages": [{"role": "user", "content": f"Say hello. ({model} anthropic)"}]}


def post(env, path: str, payload: dict) -> tuple:
    before = env.counters()
    r = httpx.post(env.url + path, json=payload, headers={"x-model": payload["model"]},
                   timeout=180)
    return r, counter_delta(before, env.counters())


def post_head(env, path: str, payload: dict) -> tuple:
    """``payload`` streamed and closed once the server reported its prompt count
    (``Client.post_head``): (the response, that count, the counter deltas)."""
    client = Client(env)
    try:
        reply = client.post_head(payload, path, headers={"x-model": payload["model"]})
    finally:
        client.close()
    return reply.resp, head_prompt_tokens(reply.events), reply.delta


@pytest.mark.parametrize("order", list(ORDERS))
def test_each_model_counted_on_its_own_server(envoy_for, order):
    env = envoy_for(order)
    for model, dialect in ORDERS[order]:
        other = next(m for m in MODELS if m != model)
        calls = {m: env.cluster_stat(f"tok-{m}", "upstream_rq_total") for m in MODELS}
        path, payload = body(model, dialect)
        r, reported, delta = post_head(env, path, payload)
        what = f"{model} {dialect}: HTTP {r.status_code} {dict(r.headers)} {delta}"
        assert r.status_code == 200, what
        assert r.headers.get("x-incontext-action") == "rewritten", what
        assert r.headers.get("x-incontext-source") == "exact", what
        prompt = int(r.headers["x-incontext-prompt-tokens"])
        assert prompt == reported, what
        # The model's own window, never the other server's.
        assert int(r.headers["x-incontext-max-tokens"]) == MODELS[model] - prompt, what
        after = {m: env.cluster_stat(f"tok-{m}", "upstream_rq_total") for m in MODELS}
        assert after[model] > calls[model] and after[other] == calls[other], (what, calls, after)
        # A route is named by its first model (metric-safe): its counters carry that name.
        name, other_name = model.replace("-", "_"), other.replace("-", "_")
        assert delta.get(f"incontext_route_{name}_rewritten") == 1, what
        assert delta.get(f"incontext_route_{other_name}_requests") is None, what
        assert delta.get("incontext_rewritten") == 1, what


def test_a_model_no_route_names_passes_unchanged(envoy_for):
    env = envoy_for("unrouted")
    payload = {"model": "tiny-c", "messages": [user("hi")], "max_tokens": 100000}
    calls = sum(env.cluster_stat(f"tok-{m}", "upstream_rq_total") for m in MODELS)
    r, delta = post(env, "/v1/chat/completions", payload)
    assert r.headers.get("x-incontext-action") == "unchanged:model", (r.status_code, r.headers)
    assert delta.get("incontext_unchanged_model") == 1, delta
    assert sum(env.cluster_stat(f"tok-{m}", "upstream_rq_total") for m in MODELS) == calls
