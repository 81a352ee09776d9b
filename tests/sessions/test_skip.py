"""Agent sessions with `skip_count` (docs/spec.md §15) against the real vLLM: every turn's
outcome equals the one vLLM's own count leads to, every bound the filter reported in place of
a count is at least that count, and the turns near the window's edge are proved by a count of
their new messages alone (the tail) rather than the whole conversation's.

OpenAI chat with tools and Anthropic Messages with tool_use / tool_result, streamed, each turn
one tool round of a few hundred tokens; B = 6000 in a 12288 window, so the cap fits until the
conversation passes 6288 tokens. Each request's stream is closed once its head arrived (vLLM
aborts the rest): the outcome is in the head, and the filter checks the skipped turns once
their stream ended."""

import json
import random
import time

import httpx

from tests.sessions.conftest import WINDOW as C

R = 32
F = 16
B = 6000
TURNS = 22
MODEL = "qwen3-tiny"
WORDS = ("def class return import self value index buffer request token window count prompt "
         "message stream config cluster route header status error result parse write").split()


def tool_output(rng):
    return "\n".join(f"{i + 1:4} {' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))}"
                     f"({rng.randint(0, 4096)});" for i in range(rng.randint(18, 26)))


def openai_turns(tag):
    rng = random.Random(tag)
    tools = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
              "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": f"[{tag}] You are a coding agent."},
                {"role": "user", "content": "The tests fail. Find out why."}]
    for t in range(TURNS):
        yield {"model": MODEL, "messages": json.loads(json.dumps(messages)), "tools": tools,
               "max_tokens": B, "stream": True}
        messages += [
            {"role": "assistant", "content": f"Step {t + 1}.", "tool_calls": [
                {"id": f"c{t}", "type": "function",
                 "function": {"name": "read", "arguments": json.dumps({"path": f"f{t}.rs"})}}]},
            {"role": "tool", "tool_call_id": f"c{t}", "content": tool_output(rng)}]
        if t == 9:
            messages.append({"role": "user", "content": "Good. Now the benchmarks."})


def anthropic_turns(tag):
    rng = random.Random(tag)
    tools = [{"name": "read", "description": "Read a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    messages = [{"role": "user", "content": "The tests fail. Find out why."}]
    for t in range(TURNS):
        yield {"model": MODEL, "system": f"[{tag}] You are a coding agent.",
               "messages": json.loads(json.dumps(messages)), "tools": tools, "max_tokens": B,
               "stream": True}
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {t + 1}."},
            {"type": "tool_use", "id": f"t{t}", "name": "read", "input": {"path": f"f{t}.rs"}}]})
        content = [{"type": "tool_result", "tool_use_id": f"t{t}", "content": tool_output(rng)}]
        if t == 9:
            content.append({"type": "text", "text": "Good. Now the benchmarks."})
        messages.append({"role": "user", "content": content})


def exact(vllm_url, dialect, body):
    """vLLM's own count of the request."""
    if dialect == "openai":
        r = httpx.post(f"{vllm_url}/tokenize", json={
            "model": MODEL, "messages": body["messages"], "tools": body["tools"]}, timeout=60)
        return r.json()["count"]
    req = {k: body[k] for k in ("model", "system", "messages", "tools")}
    r = httpx.post(f"{vllm_url}/v1/messages/count_tokens", json=req, timeout=60)
    return r.json()["input_tokens"]


def head(url, path, body):
    """The response head of a streamed request; the stream is closed unread."""
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", url + path, json=body) as resp:
            assert resp.status_code == 200, (resp.status_code, resp.read()[:300])
            return {k.lower(): v for k, v in resp.headers.items()}


def wait_checked(envoy, timeout=60.0):
    """Every skipped turn's check answered (counted after its stream ended)."""
    deadline = time.monotonic() + timeout
    while True:
        c = envoy.counters()
        checked = c.get("incontext_bound_checks", 0) + c.get("incontext_usage_checks", 0)
        if checked >= c.get("incontext_count_skipped", 0):
            return c
        assert time.monotonic() < deadline, c
        time.sleep(0.1)


def test_skipped_and_tail_counted_turns_decide_as_the_exact_count(stack, vllm):
    envoy = stack.envoy("sessions-skip", context_length=C, min_output_tokens=R,
                        fallback_margin_tokens=F, skip_count=True)
    rows = []
    for dialect, turns, path in (("openai", openai_turns, "/v1/chat/completions"),
                                 ("anthropic", anthropic_turns, "/v1/messages")):
        for t, body in enumerate(turns(f"skip-{dialect}-{time.time_ns()}")):
            p = exact(vllm.url, dialect, body)
            h = head(envoy.url, path, body)
            action, source = h.get("x-incontext-action"), h.get("x-incontext-source")
            reported = int(h.get("x-incontext-prompt-tokens", "-1"))
            # The cap that went upstream, and the one vLLM's own count leads to.
            sent = {"rewritten": lambda: int(h["x-incontext-max-tokens"]),
                    "unchanged:fits": lambda: B}.get(action, lambda: None)()
            value = min(C - p, B)
            want = value if value >= min(R, B) else None
            row = (dialect, t + 1, p, action, source, reported)
            rows.append(row)
            if action == "rewritten" and source == "bound":
                # A cap written from the bound: never above the exact one, at most 64 below.
                assert want is not None and want - 64 <= sent <= want, row
            else:
                assert sent == want, row
            if source == "bound":
                assert reported >= p, f"a bound below the count: {row}"
            elif source == "exact":
                assert reported == p, row
            # The check of a skipped turn anchors the next one.
            wait_checked(envoy)
    c = wait_checked(envoy)
    summary = "\n".join(str(r) for r in rows)
    print(summary)
    assert c.get("incontext_bound_violations", 0) == 0, (c, summary)
    for dialect in ("openai", "anthropic"):
        fits = [r for r in rows if r[0] == dialect and C - r[2] >= B]
        skipped = [r for r in fits if r[4] == "bound"]
        # Every turn whose cap fits is proved, by bytes or by the tail's count, but the first
        # (nothing to anchor it) and one at most within the seam of the edge.
        assert len(skipped) >= len(fits) - 2, summary
        # The last few turns before the edge are within a tool round's bytes of it.
        assert any(C - B - r[2] < 1500 for r in skipped), summary
    assert c.get("incontext_tail_counts", 0) >= 2, (c, summary)
    # Past the point where the caller's cap fits, the turns that leave R have their cap
    # written from the bound, without a whole count.
    banded = [r for r in rows if r[3] == "rewritten" and r[4] == "bound"]
    assert len(banded) >= 2, summary
    # The tail counts are small: the whole conversation was counted only off the path, the
    # first turn of each session and past the edge.
    assert c.get("incontext_count_calls", 0) == sum(1 for r in rows if r[4] == "exact"), c
