"""Extended thinking through Envoy + incontext, on a second real vLLM with a 2048-token window.

vLLM requires thinking.budget_tokens >= 1024 (Anthropic's minimum) and < max_tokens, and
refuses max_tokens above its window, so no thinking request is valid in the 512-token window
of the other tests (test_clients_anthropic.py checks the filter leaves those alone). Here the
window leaves room for one: max_tokens 32000 with budget_tokens 2000 is refused by vLLM when
sent directly; through the filter max_tokens becomes the rest of the window and the budget is
lowered below it (docs/spec.md §10), and vLLM serves the request.
"""

import time

import anthropic
import pytest

from tests.harness.servers import start_or_fail
from tests.clients.stack import MODEL, Stack, Vllm, fit_anthropic, input_tokens

WIDE = 2048


class WideVllm(Vllm):
    """max_model_len 2048, and Qwen3's reasoning parser: vLLM only accepts a thinking budget
    when a reasoning parser is configured."""

    def _env(self):
        env = super()._env()
        env["INCONTEXT_VLLM_MAX_MODEL_LEN"] = str(WIDE)
        return env

    def _run(self, *args, **kw):
        if args and args[0] == "start":
            args = (*args, "--reasoning-parser", "qwen3")
        return super()._run(*args, **kw)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """vLLM with max_model_len 2048 and an Envoy (context_length 2048) in front of it."""
    server = WideVllm(tmp_path_factory.mktemp("vllm-wide"))
    t0 = time.monotonic()
    start_or_fail(server, "the 2048-token vLLM")
    print(f"2048-token vLLM started in {time.monotonic() - t0:.0f} s")
    s = Stack(server, tmp_path_factory.mktemp("wide-envoy"))
    try:
        yield server, s.envoy("wide", context_length=WIDE)
    finally:
        s.stop()
        server.stop()


def test_thinking_budget_lowered_below_the_new_max_tokens(wide):
    server, envoy = wide

    def build(filler):
        return {"messages": [{"role": "user", "content": f"Think, then answer:{filler}"}]}

    request, p = fit_anthropic(server, 1000, build)       # leaves 1048: room for a budget
    kw = dict(model=MODEL, max_tokens=32000,
              thinking={"type": "enabled", "budget_tokens": 2000}, **request)
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0,
                            timeout=300).messages.create(**kw)
    assert f"cannot be greater than max_model_len={WIDE}" in str(e.value), str(e.value)

    raw = anthropic.Anthropic(base_url=envoy.url, api_key="x", max_retries=0,
                              timeout=300).messages.with_raw_response.create(**kw)
    msg = raw.parse()
    h = {k: v for k, v in raw.headers.items() if k.startswith("x-incontext")}
    assert h.get("x-incontext-action") == "rewritten", h
    assert h.get("x-incontext-source") == "exact", h
    assert int(h["x-incontext-prompt-tokens"]) == input_tokens(msg.usage) == p, h
    assert int(h["x-incontext-max-tokens"]) == WIDE - p, h
    assert input_tokens(msg.usage) + msg.usage.output_tokens <= WIDE, msg.usage
