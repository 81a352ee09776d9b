"""Hostile /v1/messages bodies over raw HTTP through Envoy + incontext to the real vLLM: each
has one defined outcome, nothing is lost, and Envoy never answers 5xx.

A string or huge max_tokens is a caller cap the filter reads as docs/spec.md §3 says ("512" →
512, huge → saturated) and rewrites to the rest of the window, so vLLM serves requests it
refuses or clamps when sent directly. Anthropic requires max_tokens: without a valid one
(missing, 0) there is nothing to budget, and the request reaches vLLM unchanged (`no_cap`) for
vLLM's own 400. Bodies the filter does not budget (messages not an array) or cannot count
(content blocks of unknown types) also reach vLLM unchanged and get vLLM's own answer. A 5 MB
prompt far beyond the window reaches vLLM unchanged too (`too_long`), and vLLM's refusal comes
back as Anthropic's "prompt is too long" (docs/spec.md §13).
"""

import json

import httpx
import pytest

from tests.clients.stack import C, MODEL, fit_anthropic, incontext, input_tokens, int_header


def post(url, body, raw=None):
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url + "/v1/messages", content=content,
                      headers={"content-type": "application/json"}, timeout=180)


def near_window(vllm, nonce):
    def build(filler):
        return {"messages": [{"role": "user", "content": f"Summarise this ({nonce}):{filler}"}]}
    return fit_anthropic(vllm, 440, build)


CAPS = {
    "string-512": ("512", None),           # vLLM 0.32 parses it and clamps silently
    "huge": (10 ** 30, "cannot be greater than max_model_len"),
}
NO_CAP = {
    "missing": (None, "Field required"),
    "zero": (0, "max_tokens must be positive"),
}


@pytest.mark.parametrize("case", sorted(CAPS))
def test_odd_max_tokens_rewritten_into_the_window(vllm, envoy, case):
    value, vllm_error = CAPS[case]
    request, p = near_window(vllm, f"hostile-{case}")
    body = {"model": MODEL, "max_tokens": value, **request}
    direct = post(vllm.url, body)
    if vllm_error:
        assert direct.status_code == 400 and vllm_error in direct.text, direct.text[:300]
    else:
        assert direct.status_code == 200, direct.text[:300]
        assert direct.json()["usage"]["output_tokens"] <= C - p   # the silent clamp

    via = post(envoy.url, body)
    assert via.status_code == 200, (incontext(via.headers), via.text[:300])
    h = incontext(via.headers)
    assert h.get("x-incontext-action") == "rewritten", h
    assert int_header(via.headers, "x-incontext-prompt-tokens") == p, h
    assert int_header(via.headers, "x-incontext-max-tokens") == C - p, h
    usage = via.json()["usage"]
    assert input_tokens(usage) == p
    assert input_tokens(usage) + usage["output_tokens"] <= C


@pytest.mark.parametrize("case", sorted(NO_CAP))
def test_no_valid_max_tokens_passes_to_vllm(vllm, envoy, case):
    value, vllm_error = NO_CAP[case]
    request, p = near_window(vllm, f"hostile-{case}")
    body = {"model": MODEL, **request}
    if value is not None:
        body["max_tokens"] = value
    direct = post(vllm.url, body)
    via = post(envoy.url, body)
    assert direct.status_code == 400 and vllm_error in direct.text, direct.text[:300]
    assert incontext(via.headers).get("x-incontext-action") == "unchanged:no_cap", \
        incontext(via.headers)
    assert via.status_code == 400 and via.json() == direct.json(), via.text[:300]


def test_messages_not_an_array_passes_to_vllm(vllm, envoy):
    body = {"model": MODEL, "max_tokens": 32000, "messages": "hello"}
    direct = post(vllm.url, body)
    via = post(envoy.url, body)
    assert direct.status_code == 400
    h = incontext(via.headers)
    assert (h.get("x-incontext-action") or "").startswith("unchanged:"), h
    assert via.status_code == 400 and via.json() == direct.json(), via.text[:300]


def test_unknown_content_blocks_pass_to_vllm(vllm, envoy):
    """vLLM's counter refuses the blocks, so the filter estimates; vLLM then answers the
    request itself (its own validation error) exactly as when sent directly."""
    body = {"model": MODEL, "max_tokens": 32000, "messages": [
        {"role": "user", "content": [{"type": "hologram", "frames": [1, 2, 3]},
                                     {"type": "text", "text": "What is this?"}]}]}
    direct = post(vllm.url, body)
    via = post(envoy.url, body)
    assert direct.status_code == 400
    assert via.status_code == 400, (incontext(via.headers), via.text[:300])
    assert incontext(via.headers).get("x-incontext-source") == "estimate", incontext(via.headers)


def test_5_mb_body_reaches_vllm(vllm, envoy):
    text = ("The quick brown fox jumps over the lazy dog. " * 120000)[:5 * 1024 * 1024]
    raw = json.dumps({"model": MODEL, "max_tokens": 32000,
                      "messages": [{"role": "user", "content": text}]}).encode()
    assert len(raw) > 5 * 1024 * 1024
    direct = post(vllm.url, None, raw)
    via = post(envoy.url, None, raw)
    assert direct.status_code == 400
    h = incontext(via.headers)
    # vLLM's counter refuses it as longer than the window: it names its characters, not a
    # token count. Passthrough mode sends it on; vLLM refuses it, and the client gets
    # Anthropic's "prompt is too long". P is the filter's estimate, and the source says so.
    counted = httpx.post(vllm.url + "/v1/messages/count_tokens", content=raw,
                         headers={"content-type": "application/json"}, timeout=180)
    assert counted.status_code == 400 and "characters" in counted.text, counted.text[:300]
    assert h.get("x-incontext-action") == "unchanged:too_long", h
    assert h.get("x-incontext-source") == "estimate", h
    p = int_header(via.headers, "x-incontext-prompt-tokens")
    assert p is not None and p > C, h
    assert via.status_code == 400, via.text[:300]
    assert via.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {p} tokens > {C} maximum"}}, via.text[:300]
