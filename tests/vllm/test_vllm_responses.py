"""The Responses API on a vLLM that does not serve its render API (started without
`--enable-scale-out`, as this suite's server is): `/v1/responses/render` answers 403, a
counted tokenizer failure, and the filter budgets `max_output_tokens` from the rough estimate
over the raw `input`, `instructions` and `tools` plus F (docs/spec.md §14). The exact count
against a server that renders is in tests/clients/test_clients_responses.py.
"""

import json

import httpx
import pytest

from tests.harness.spec import rough, top_level_members
from tests.vllm.stack import C, F, MODEL

pytestmark = pytest.mark.newest_vllm_only

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def expected_estimate(raw: bytes) -> int:
    """max(1, the rough estimate over the raw `input`, `instructions` and `tools` text)."""
    members = top_level_members(raw)
    text = b"".join(raw[s:e] for k, (_, (s, e)) in members.items()
                    if k in ("input", "instructions", "tools"))
    return max(1, rough(text))


def test_render_forbidden_falls_back_to_the_estimate(vllm, exact):
    body = {"model": MODEL, "instructions": "You are terse.", "tools": TOOLS,
            "input": [{"role": "user", "content": "Say hello in three words (no-render)."}],
            "max_output_tokens": 100000, "temperature": 0}
    direct = httpx.post(vllm.url + "/v1/responses/render",
                        json={k: v for k, v in body.items() if k != "max_output_tokens"},
                        timeout=30)
    assert direct.status_code == 403, (direct.status_code, direct.text[:200])

    res = exact.post(body, path="/v1/responses")
    assert res.status == 200, res.describe()
    p = expected_estimate(res.raw)
    assert res.action == "rewritten", res.describe()
    assert res.source == "estimate", res.describe()
    assert res.prompt_tokens_header == p, res.describe()
    assert res.max_tokens_header == C - p - F, res.describe()
    assert res.delta.get("incontext_tokenizer_failures_status") == 1, res.describe()
    assert res.delta.get("incontext_estimates") == 1, res.describe()
    usage = res.json()["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= C, usage


def test_a_stream_without_a_cap_is_budgeted_and_streamed(vllm, exact):
    body = {"model": MODEL, "input": "Count to three (no-render stream).", "stream": True,
            "store": False, "temperature": 0}
    res = exact.post(body, path="/v1/responses")
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", res.describe()
    assert res.source == "estimate", res.describe()
    assert res.max_tokens_header == C - expected_estimate(res.raw) - F, res.describe()
    events = [json.loads(line[6:]) for line in res.resp.text.splitlines()
              if line.startswith("data: ")]
    assert events and events[-1]["type"] == "response.completed", res.resp.text[-300:]
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= C, usage
