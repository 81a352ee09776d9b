"""The real agents' own conversations, replayed byte for byte through Envoy + incontext
(skipping on, as shipped) against the real vLLM: on each agent's later turns the filter must
send most requests upstream without a whole count on their path, and decide every one as
vLLM's own count would.

The recordings (bench/sessions/recorded/<agent>.jsonl.gz, written by bench/sessions/record.py
from the pinned agents) hold every request of one conversation of eight turns of Claude Code,
Codex CLI, OpenCode and Qwen Code, each continued with the agent's own `--continue` / `resume`:
method, path, headers, and the body's bytes as the agent sent them. Each is sent here as it
stands, in order; before it, vLLM's own count of it (Anthropic `/v1/messages/count_tokens`,
chat `/tokenize`, Responses `/v1/responses/render`). Each answer's stream is closed once its
first event arrived (vLLM aborts the rest); the filter checks each turn it sent on a bound
(the answer's usage where it came, else a count once the stream ended), and the next turn waits
for that check, as the agent would have waited for its answer.

Per agent (window 12288, R 64 as in test_agents.py: Claude Code's ~11.6k-token prompt leaves
~400 tokens; everything else the plugin's defaults):
* at least 60 % of its requests on turns 2.. go upstream without a whole count on their path
  (`x-incontext-source: bound`: skipped, or only their new messages counted). Qwen Code's cap
  (32768) exceeds this window, so each of its turns needs a cap written from a bound, and each
  sends its previous message again without the date reminder block, which it moves to the
  newest message: its new messages are counted without that block (docs/spec.md §15b);
* every outcome is the one vLLM's count leads to (a cap written from a bound: never above the
  exact one, at most 64 below it), every bound is at least that count, every exact count is it;
* every turn sent on a bound is checked — Claude Code's by its answer's usage (`message_start`
  comes first), the others' by a count after the closed stream, since their usage comes at
  the stream's end — and no check found a bound below its count
  (`incontext_bound_violations` 0).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from tests.sessions.conftest import WINDOW as C
from tests.sessions.test_skip import wait_checked

RECORDED = Path(__file__).resolve().parents[2] / "bench" / "sessions" / "recorded"
AGENTS = ("claude", "codex", "opencode", "qwen")
R = 64
SHARE = 0.60
CAPS = {"/v1/messages": ("max_tokens",), "/v1/chat/completions": ("max_tokens",
                                                                  "max_completion_tokens"),
        "/v1/responses": ("max_output_tokens",)}


def recording(agent):
    path = RECORDED / f"{agent}.jsonl.gz"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run bench/sessions/record.py", pytrace=False)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def route(path):
    bare = path.split("?", 1)[0]
    return next(r for r in CAPS if bare.endswith(r))


def exact(vllm_url, path, body):
    """vLLM's own count of the request."""
    kind = route(path)
    if kind == "/v1/messages":
        req = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        r = httpx.post(f"{vllm_url}/v1/messages/count_tokens", json=req, timeout=60)
        assert r.status_code == 200, r.text[:300]
        return r.json()["input_tokens"]
    if kind == "/v1/chat/completions":
        req = {k: body[k] for k in ("model", "messages", "tools") if k in body}
        r = httpx.post(f"{vllm_url}/tokenize", json=req, timeout=60)
        assert r.status_code == 200, r.text[:300]
        return r.json()["count"]
    req = {k: v for k, v in body.items() if k not in ("max_output_tokens", "stream")}
    r = httpx.post(f"{vllm_url}/v1/responses/render", json=req, timeout=60)
    assert r.status_code == 200, r.text[:300]
    return len(r.json()["token_ids"])


def cap_of(path, body):
    """The caller's cap (B), or None."""
    for name in CAPS[route(path)]:
        if isinstance(body.get(name), int):
            return body[name]
    return None


def wanted(p, b):
    """The cap the exact count leads to (docs/spec.md §2; W = C, no T): the value written, or
    None where the request passes unchanged for lack of room."""
    value = C - p if b is None else min(C - p, b)
    return value if value >= (R if b is None else min(R, b)) else None


def sent_cap(h, p_exact, b):
    """The cap that went upstream, from the filter's headers; without a cap, `unchanged:fits`
    leaves vLLM its own C − P."""
    action = h.get("x-incontext-action")
    if action == "rewritten":
        return int(h["x-incontext-max-tokens"])
    if action == "unchanged:fits":
        return b if b is not None else C - p_exact
    if action == "unchanged:insufficient":
        return None
    return action       # any other outcome differs from the exact count's


def first_event(url, record):
    """The response head of the recorded request sent as it stands; the stream is closed once
    its first event arrived."""
    headers = dict(record["headers"])
    with httpx.Client(timeout=120) as http:
        with http.stream(record["method"], url + record["path"], headers=headers,
                         content=record["body"].encode("utf-8")) as resp:
            assert resp.status_code == 200, (resp.status_code, resp.read()[:300])
            for chunk in resp.iter_raw():
                if b"data:" in chunk:
                    break
            return {k.lower(): v for k, v in resp.headers.items()}


def replay(stack, vllm, agent):
    envoy = stack.envoy(f"recorded-{agent}", context_length=C, min_output_tokens=R)
    rows = []
    for record in recording(agent):
        body = json.loads(record["body"])
        p = exact(vllm.url, record["path"], body)
        b = cap_of(record["path"], body)
        h = first_event(envoy.url, record)
        source = h.get("x-incontext-source")
        reported = int(h.get("x-incontext-prompt-tokens", "-1"))
        want, got = wanted(p, b), sent_cap(h, p, b)
        if h.get("x-incontext-action") == "rewritten" and source == "bound":
            ok = want is not None and want - 64 <= got <= want
        else:
            ok = got == want
        if source == "bound":
            ok = ok and reported >= p
        elif source == "exact":
            ok = ok and reported == p
        rows.append({"turn": record["turn"], "seq": record["seq"], "P": p, "B": b,
                     "action": h.get("x-incontext-action"), "source": source,
                     "reported": reported, "want": want, "sent": got, "ok": ok})
        wait_checked(envoy)
    return rows, wait_checked(envoy)


@pytest.mark.parametrize("agent", AGENTS)
def test_recorded_agent_turns_go_without_a_whole_count(stack, vllm, agent):
    rows, c = replay(stack, vllm, agent)
    later = [r for r in rows if r["turn"] >= 2]
    bound = [r for r in later if r["source"] == "bound"]
    table = "\n".join(f"  turn {r['turn']} #{r['seq']}: P {r['P']} B {r['B']} -> {r['action']} "
                      f"{r['source']} {r['reported']} (cap sent {r['sent']}, exact count's "
                      f"{r['want']}){'' if r['ok'] else '  <-- differs'}" for r in rows)
    counters = {k: c.get(k, 0) for k in (
        "incontext_count_calls", "incontext_tail_counts", "incontext_count_skipped",
        "incontext_usage_checks", "incontext_bound_checks", "incontext_bound_violations")}
    summary = (f"{agent}: {len(bound)} of {len(later)} requests on turns 2.. without a whole "
               f"count on their path; counters {counters}\n{table}")
    print(summary)
    assert [r for r in rows if not r["ok"]] == [], summary
    assert c.get("incontext_bound_violations", 0) == 0, summary
    skipped = sum(1 for r in rows if r["source"] == "bound")
    assert c.get("incontext_count_skipped", 0) == skipped, summary
    # Each turn sent on a bound was checked: by its answer's usage or, the stream closed
    # before it, by a count after the stream.
    assert c.get("incontext_usage_checks", 0) + c.get("incontext_bound_checks", 0) == skipped, \
        summary
    if agent == "claude":       # Anthropic's usage comes in the stream's first event
        assert c.get("incontext_usage_checks", 0) == skipped, summary
    assert len(bound) >= SHARE * len(later), summary
