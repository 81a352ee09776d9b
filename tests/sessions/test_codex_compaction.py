"""Codex CLI's own compaction with the settings docs/agents.md gives, through Envoy + incontext
in reject mode against the suite's vLLM: W = 12288 (incontext's window, the server's), R = 1920,
`model_context_window = W` and `model_auto_compact_token_limit = L` = W − R − G at the top of
its config.toml (clis.CODEX_COMPACTION, then clis.CODEX_TOML), G = 160 the most one turn adds
before its first request. R + G is above W/10, so L is below Codex's own 90 % of W and binds.

What Codex 0.169.0 does (openai/codex, codex-rs/core/src/session/turn.rs): before each turn
(`run_pre_sampling_compact`) and after a sampling request that needs a follow-up (a tool call),
it compacts when its token usage reached min(model_auto_compact_token_limit, 90 % of
model_context_window) (`auto_compact_token_status`; `ModelInfo::auto_compact_token_limit`).
Its usage is the last answer's `total_tokens` (the Responses `usage` it got: input + output)
plus an estimate of the items added since (a tool's output); the new user message is not in it,
since the check before a turn runs before that message is recorded. For a provider other than
OpenAI the compaction is local (codex-rs/core/src/compact.rs): one more streamed `POST
/v1/responses`, the history without tools, its last input the user message "You are performing
a CONTEXT CHECKPOINT COMPACTION. …"; the history then becomes Codex's initial context, the
user's messages (up to 20,000 tokens of them) and the answer as a user message starting "Another
language model started to solve this problem …". A window error ends the turn (it never
compacts on one), so the limit is its whole story at the edge.

The random-weight model never ends an answer, so a pass-through in front of Envoy (``Tap``) adds
`max_output_tokens` N to each request (an answer of N tokens, as a real model's ends); Codex
sends none itself. A conversation of TURNS turns (`codex exec`, then `codex exec resume --last`),
each a one-line message, grows by about its N-token answer per turn. Asserted: every turn
completes; exactly one compaction request, sent between two turns exactly when the earlier
one's input + output reached L, by the run of the later turn (before its request); no request
refused by incontext (every answer 200, no `x-incontext-action: rejected`, `incontext_rejected`
0); what a turn added was at most G, and without the compaction the turn after it would have
been refused (the usage before it plus the least a turn added is above W − R); that turn is
served with the summary in its input and none of the answers before it. The numbers are
printed (`pytest -s`). About 75 s, and 20 s for the refused turn's case below.
"""

from __future__ import annotations

import json
from typing import List, Optional

from tests.sessions import clis
from tests.sessions.clis import Sent, Tap
from tests.sessions.conftest import WINDOW
from tests.sessions.test_agents import agent_stack  # noqa: F401

W = WINDOW              # incontext's window (the server's) and Codex's model_context_window
R = 1920                # incontext's min_output_tokens: R + G above W/10, so the limit binds
G = 160                 # the most one turn adds before its first request (a one-line message)
L = W - R - G           # model_auto_compact_token_limit, 10208 (90 % of W: 11059)
N = 400                 # the length of every answer (the cap the pass-through adds)
TURNS = 6
SETTINGS = clis.CODEX_COMPACTION + "\n"
COMPACT = "You are performing a CONTEXT CHECKPOINT COMPACTION."
SUMMARY = "Another language model started to solve this problem"
MESSAGE = "Turn {}: read on."


def answers_of(n: int):
    """The pass-through's rewrite: `max_output_tokens` n on every Responses request."""
    def forward(path: str, raw: bytes) -> bytes:
        if not path.split("?", 1)[0].endswith("/v1/responses"):
            return raw
        body = json.loads(raw)
        body["max_output_tokens"] = n
        return json.dumps(body).encode()
    return forward


def user_texts(body: dict) -> List[str]:
    return [c.get("text", "") for item in body.get("input", [])
            if item.get("type", "message") == "message" and item.get("role") == "user"
            for c in (item.get("content") if isinstance(item.get("content"), list) else [])]


def is_compaction(sent: Sent) -> bool:
    texts = user_texts(sent.body or {})
    return bool(texts) and texts[-1].startswith(COMPACT)


def usage(sent: Sent) -> Optional[dict]:
    """The `usage` of the answer's `response.completed` event."""
    for line in sent.answer.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            if event.get("type") == "response.completed":
                return event["response"]["usage"]
    return None


def test_codex_compacts_before_the_window_is_full(agent_stack, tmp_path):  # noqa: F811
    assert SETTINGS == f"model_context_window = {W}\nmodel_auto_compact_token_limit = {L}\n\n"
    assert L < W * 9 // 10
    _, stack = agent_stack
    env = stack.envoy("codex-compact", context_length=W, min_output_tokens=R,
                      on_insufficient="reject")
    runs, ends = [], []         # each run's events; how many requests were sent after it
    with Tap(env.url, forward=answers_of(N)) as tap:
        for turn in range(TURNS):
            runs.append(clis.codex(tap.url, tmp_path, MESSAGE.format(turn), resume=turn > 0,
                                   settings=SETTINGS))
            ends.append(len(tap.sent))
    sent = tap.calls("/v1/responses")
    rows = []
    for s in sent:
        u = usage(s)
        assert u, (s.status, s.answer[-300:])
        h = s.answer_headers or {}
        rows.append((("compaction" if is_compaction(s) else "turn"), s.status,
                     h.get("x-incontext-action"), u.get("input_tokens"),
                     u.get("output_tokens"), len(s.body.get("tools") or [])))
    print("\ncodex compaction: kind, status, action, input, output, tools")
    for row in rows:
        print("  ", row)

    for turn, events in enumerate(runs):
        kinds = [e.get("type") for e in events]
        assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds, (turn, events[-3:])
    assert len(tap.sent) == len(sent), [(s.method, s.path) for s in tap.sent]
    assert [s.status for s in sent] == [200] * len(sent), rows
    assert all((s.answer_headers or {}).get("x-incontext-action") != "rejected" for s in sent)
    assert env.counters()["incontext_rejected"] == 0, env.counters()

    kinds = [r[0] for r in rows]
    assert kinds.count("compaction") == 1, rows
    assert kinds.count("turn") == TURNS, rows
    c = kinds.index("compaction")
    assert 0 < c < len(sent) - 1, rows
    # Sent at the start of the turn after it (`codex exec resume`), before that turn's request.
    assert ends == [*range(1, c + 1), *range(c + 2, TURNS + 2)], (ends, c)
    # Between two turns Codex compacted exactly when the earlier one's input + output reached L.
    totals = [r[3] + r[4] for r in rows]
    turns = [i for i, k in enumerate(kinds) if k == "turn"]
    for a, b in zip(turns, turns[1:]):
        assert (b - a == 2) == (totals[a] >= L), (a, rows, L)
    # What a turn adds to the previous answer's usage (its message, and the answer's text
    # counted again as input): at most G; without the compaction the turn after it would have
    # been refused (its prompt above W − R).
    growth = [rows[b][3] - totals[a] for a, b in zip(turns, turns[1:]) if b - a == 1]
    print(f"   growth {growth}, L {L}, W - R {W - R}")
    assert growth and max(growth) <= G, growth
    assert totals[c - 1] + min(growth) > W - R, (rows, growth)
    # The compaction request: the history without tools, Codex's prompt last; N tokens of
    # summary.
    compaction = sent[c]
    assert not compaction.body.get("tools"), sorted(compaction.body)
    assert rows[c][4] == N, rows[c]
    # The session goes on: the next turn carries the summary, not the answers before it.
    after = sent[c + 1].body
    assert sum(t.startswith(SUMMARY) for t in user_texts(after)) == 1, user_texts(after)
    assert not [i for i in after["input"] if i.get("role") == "assistant"], after["input"]
    assert rows[c + 1][3] < totals[c - 1], rows
    assert max(r[3] for r in rows) <= W - R, rows


def test_codex_compacts_after_a_refused_turn_but_its_own_prompt_stays_too_long(
        agent_stack, tmp_path):  # noqa: F811
    """A window below Codex's own prompt (its instructions and 9 tools, ~8.2k tokens), with
    `model_context_window` = W alone: the first turn is refused (the window error ends it);
    Codex then counts its usage as the full window (`set_total_tokens_full`,
    codex-rs/core/src/session/turn.rs), so the next turn begins with a compaction, served (its
    history has no tools), and then its own request is refused again: compaction cannot make
    room below Codex's own prompt."""
    w, r, n = 8192, 64, 64
    _, stack = agent_stack
    env = stack.envoy("codex-refused", context_length=W, window_tokens=w, min_output_tokens=r,
                      on_insufficient="reject")
    runs = []
    with Tap(env.url, forward=answers_of(n)) as tap:
        for turn in range(2):
            runs.append(clis.codex(tap.url, tmp_path, MESSAGE.format(turn), resume=turn > 0,
                                   settings=f"model_context_window = {w}\n\n"))
    for events in runs:
        failed = [e for e in events if e.get("type") == "turn.failed"]
        assert len(failed) == 1 and events[-1] is failed[0], events[-3:]
        assert "ran out of room in the model's context window" in \
            failed[0]["error"]["message"], failed[0]
    sent = tap.calls("/v1/responses")
    assert len(tap.sent) == len(sent) == 3, [(s.method, s.path) for s in tap.sent]
    assert [(is_compaction(s), s.status, (s.answer_headers or {}).get("x-incontext-action"))
            for s in sent] == [(False, 400, "rejected"), (True, 200, "rewritten"),
                               (False, 400, "rejected")], [(s.status, s.answer_headers)
                                                           for s in sent]
    assert not sent[1].body.get("tools") and sent[0].body.get("tools"), sorted(sent[1].body)
    compacted = usage(sent[1])
    prompts = [int(s.answer_headers["x-incontext-prompt-tokens"]) for s in sent]
    print(f"\ncodex after a refused turn: prompts {prompts}, compaction usage {compacted}")
    assert compacted["input_tokens"] == prompts[1] and compacted["output_tokens"] == n
    assert min(prompts[0], prompts[2]) > w - r, prompts
    assert sum(t.startswith(SUMMARY) for t in user_texts(sent[2].body)) == 1
    assert env.counters()["incontext_rejected"] == 2, env.counters()
