"""The real agents through Envoy + incontext, offline, against the real vLLM 0.32 with a
12288-token window (`--enable-scale-out`; tests/sessions/conftest.py): Claude Code, Codex CLI,
OpenCode and Qwen Code, configured as docs/agents.md shows (tests/sessions/clis.py). A missing
agent binary FAILS the test.

* Straight to vLLM: Claude Code's `max_tokens` 32000, OpenCode's 32000 and Qwen Code's 32768
  are above the window; vLLM answers 400 ("… cannot be greater than max_model_len=12288") and
  each agent reports that error as it came, none as a full window. What each sent (the cap,
  `stream`, its session header) is read on the way (``Tap``).
* Reject mode at a window the agent's prompt overflows: the filter answers the window-full
  error of the agent's dialect and the agent classifies it itself — Claude Code its "Prompt is
  too long" report (`terminal_reason` `prompt_too_long`); Codex "ran out of room in the model's
  context window"; OpenCode a `ContextOverflowError`, on which it runs its compaction (refused
  too: the window is below every prompt it sends); Qwen Code "Context length exceeded;
  attempting reactive compression" in its debug log, with the prompt size it read from the
  error's "resulted in P tokens": the filter's P exactly.
* Served through incontext: a window a little larger than the agent's prompt (`window_tokens` =
  P + ROOM, P read from the reject run), so the answer is short on this CPU: the filter rewrites
  the cap to W − P and the request is served, counted as vLLM counts it. Claude Code continues a
  conversation the window ended (the random-weight model never ends an answer itself) and then
  gets its own "Prompt is too long", never vLLM's raw 400.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import pytest

from tests.sessions import agents, clis
from tests.sessions.clis import Tap
from tests.sessions.conftest import WINDOW

SMALL = 8192            # a window Claude Code's, Codex's and Qwen Code's prompts overflow
TINY = 256              # below every prompt OpenCode sends (~7.2k; its compaction's ~0.4k)
ROOM = 256              # output room of the served runs
R = 64
DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


@pytest.fixture(scope="module")
def agent_stack(vllm, stack):
    for binary in (clis.CLAUDE, clis.CODEX, clis.OPENCODE, clis.QWEN):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run scripts/setup-sessions.sh", pytrace=False)
    return vllm, stack


def envoy(stack, name, **changes):
    return stack.envoy(name, context_length=WINDOW, min_output_tokens=R, **changes)


def prompts_of(env, what) -> list:
    """P of every request the filter decided, in order, from its debug log lines (counts only;
    Envoy writes its log file out within seconds)."""
    for _ in range(40):
        found = re.findall(r"incontext: (?:rejected|rewritten) prompt=(\d+)",
                           env.log_path.read_text(errors="replace"))
        if found:
            return [int(p) for p in found]
        time.sleep(0.5)
    raise AssertionError(f"no decision logged by the filter for {what}")


def prompt_of(env, what) -> int:
    """P of the last request the filter decided."""
    return prompts_of(env, what)[-1]


def too_large(cap: int) -> str:
    """vLLM's refusal of a cap above its window."""
    return f"max_tokens={cap} cannot be greater than max_model_len={WINDOW}"


# --- docs/agents.md ------------------------------------------------------------------------
def test_docs_show_the_configurations_the_tests_run():
    """Every configuration docs/agents.md shows is the one these tests run, verbatim: the
    blocks after `<!-- tests/sessions: NAME -->`."""
    text = DOC.read_text()
    found = re.findall(r"<!-- tests/sessions: (\S+) -->\n```[a-z]*\n(.*?)```", text, re.S)
    expected = dict(clis.SNIPPETS)
    for fn in (agents.anthropic_client, agents.openai_client, agents.litellm_completion):
        expected[f"agents.py:{fn.__name__}"] = inspect.getsource(fn)
    assert sorted(name for name, _ in found) == sorted(expected), \
        "docs/agents.md must show each configuration exactly once"
    for name, block in found:
        assert block == expected[name], f"docs/agents.md's {name} differs from the tests'"


# --- Claude Code ---------------------------------------------------------------------------
def brief(result: dict) -> dict:
    return {k: result.get(k) for k in ("is_error", "api_error_status", "terminal_reason",
                                        "num_turns", "result", "usage")}


def test_claude_code_straight_to_vllm_gets_its_400(agent_stack, tmp_path):
    server, _ = agent_stack
    with Tap(server.url) as tap:
        result = clis.claude(tap.url, tmp_path)
    assert result["is_error"] is True, brief(result)
    assert result.get("api_error_status") == 400, brief(result)
    assert f"cannot be greater than max_model_len={WINDOW}" in result["result"], brief(result)
    # It sends the refused request six times (its own retries), each the same.
    sent = tap.calls("/v1/messages")
    assert len(sent) == len(tap.sent) == 6, [(s.method, s.path, s.status) for s in tap.sent]
    assert {(s.body["max_tokens"], s.body["stream"], s.status) for s in sent} == \
        {(32000, True, 400)}, [(s.body["max_tokens"], s.status) for s in sent]
    assert len({s.headers.get("x-claude-code-session-id") for s in sent}) == 1
    assert sent[0].headers.get("x-claude-code-session-id"), sent[0].headers


def test_claude_code_prompt_too_long_in_reject_mode_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "claude-reject", window_tokens=SMALL, on_insufficient="reject")
    result = clis.claude(reject.url, tmp_path / "reject")
    assert result["is_error"] is True, brief(result)
    assert result.get("terminal_reason") == "prompt_too_long", brief(result)
    assert result["result"].startswith("Prompt is too long"), brief(result)
    m = re.search(r"~(\d+) tokens \(limit (\d+)\)", result["result"])
    assert m and int(m.group(2)) == SMALL - R, result["result"]
    p = prompt_of(reject, "Claude Code's request")
    assert int(m.group(1)) == p, (m.group(0), p)

    served = envoy(stack, "claude-served", window_tokens=p + ROOM)
    result = clis.claude(served.url, tmp_path / "served")
    # Its request is served: the cap rewritten to W − P. The tiny model with random weights
    # never ends an answer itself, so the window ends it (`model_context_window_exceeded`);
    # Claude Code then continues the conversation, which no longer fits, and must get its own
    # signal for that — never vLLM's raw 400 (docs/spec.md §13).
    assert result["usage"]["input_tokens"] == p, brief(result)
    assert 0 < result["usage"]["output_tokens"] <= ROOM, brief(result)
    assert not result["result"].startswith("API Error"), brief(result)
    assert not result["is_error"] or result.get("terminal_reason") == "prompt_too_long", \
        brief(result)


# --- Codex CLI -----------------------------------------------------------------------------
def test_codex_context_window_in_reject_mode_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "codex-reject", window_tokens=SMALL, on_insufficient="reject")
    with Tap(reject.url) as tap:
        events = clis.codex(tap.url, tmp_path / "reject")
    failed = [e for e in events if e.get("type") == "turn.failed"]
    assert failed, events[-3:]
    assert "ran out of room in the model's context window" in failed[-1]["error"]["message"], \
        failed[-1]
    p = prompt_of(reject, "Codex's request")
    assert p > SMALL - R, p
    sent = tap.calls("/v1/responses")
    assert len(sent) == 1 and len(tap.sent) == 1, [(s.method, s.path) for s in tap.sent]
    body = sent[0].body
    assert body["stream"] is True and body["store"] is False, sorted(body)
    assert "max_output_tokens" not in body, sorted(body)
    assert sent[0].headers.get("session-id"), sent[0].headers

    served = envoy(stack, "codex-served", window_tokens=p + ROOM)
    events = clis.codex(served.url, tmp_path / "served")
    done = [e for e in events if e.get("type") == "turn.completed"]
    assert done, events[-3:]
    usage = done[-1]["usage"]
    assert usage["input_tokens"] == p, usage
    assert 0 < usage["output_tokens"] <= ROOM, usage
    assert prompt_of(served, "Codex's request") == p


# --- OpenCode ------------------------------------------------------------------------------
def test_opencode_straight_to_vllm_gets_its_400(agent_stack, tmp_path):
    server, _ = agent_stack
    with Tap(server.url) as tap:
        run = clis.opencode(tap.url, tmp_path)
    errors = run.errors()
    assert [e["name"] for e in errors] == ["APIError"], errors
    assert too_large(32000) in errors[0]["data"]["message"], errors[0]
    assert run.calls() == ["build"], run.calls()     # no compaction: not a full window to it
    sent = tap.calls("/v1/chat/completions")
    assert len(sent) == 1 and len(tap.sent) == 1, [(s.method, s.path) for s in tap.sent]
    body, headers = sent[0].body, sent[0].headers
    assert body["max_tokens"] == 32000 and body["stream"] is True, sorted(body)
    session = run.events[0]["sessionID"]
    assert headers.get("x-session-id") == headers.get("x-session-affinity") == session, headers


def test_opencode_context_overflow_in_reject_mode_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "opencode-reject", window_tokens=TINY, on_insufficient="reject")
    run = clis.opencode(reject.url, tmp_path / "reject")
    # Its own classification of the filter's answer, then its compaction (a summary request,
    # refused too at this window), then the error.
    assert run.calls() == ["build", "compaction"], run.calls()
    errors = run.errors()
    assert errors and {e["name"] for e in errors} == {"ContextOverflowError"}, errors
    prompts = prompts_of(reject, "OpenCode's requests")
    assert len(prompts) == 2 and prompts[0] > prompts[1] >= TINY, prompts
    p = prompts[0]

    served = envoy(stack, "opencode-served", window_tokens=p + ROOM)
    run = clis.opencode(served.url, tmp_path / "served")
    assert run.errors() == [], run.errors()
    assert run.calls() == ["build"], run.calls()
    steps = [e["part"] for e in run.events if e.get("type") == "step_finish"]
    assert len(steps) == 1, run.events
    tokens = steps[0]["tokens"]
    assert tokens["input"] + tokens["cache"]["read"] == p, tokens
    assert 0 < tokens["output"] <= ROOM, tokens
    assert prompt_of(served, "OpenCode's request") == p


# --- Qwen Code -----------------------------------------------------------------------------
REACTIVE = "Context length exceeded; attempting reactive compression."


def test_qwen_code_straight_to_vllm_gets_its_400(agent_stack, tmp_path):
    server, _ = agent_stack
    with Tap(server.url) as tap:
        run = clis.qwen(tap.url, tmp_path)
    assert run.result["is_error"] is True, run.result
    assert too_large(32768) in run.result["error"]["message"], run.result
    assert REACTIVE not in run.debug        # not a full window to it
    sent = tap.calls("/v1/chat/completions")
    assert len(sent) == 1 and len(tap.sent) == 1, [(s.method, s.path) for s in tap.sent]
    body, headers = sent[0].body, sent[0].headers
    assert body["max_tokens"] == 32768 and body["stream"] is True, sorted(body)
    assert not [h for h in headers if "session" in h], headers


def test_qwen_code_reads_the_prompt_size_from_the_reject_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "qwen-reject", window_tokens=SMALL, on_insufficient="reject")
    with Tap(reject.url) as tap:
        run = clis.qwen(tap.url, tmp_path / "reject")
    assert len(tap.sent) == 1 and tap.sent[0].status == 400, tap.sent
    answer = tap.sent[0].answer_headers
    assert answer["x-incontext-action"] == "rejected", answer
    p = int(answer["x-incontext-prompt-tokens"])
    assert p > SMALL, p
    # Its own classification, and the prompt size it read from "resulted in P tokens": exact
    # (not its estimate), the filter's P.
    assert run.debug.count(REACTIVE) == 1, run.debug[-2000:]
    assert len(re.findall(rf"originalTokenCount={p}, estimated=false", run.debug)) == 1, \
        re.findall(r"originalTokenCount=\d+, estimated=\w+", run.debug)
    assert run.result["is_error"] is True, run.result

    # Served: the window ends its answer (`finish_reason` `length`), which it takes for its
    # own cap: it asks again (an escalation to 64000 its own output limit for `qwen…` names
    # brings back to 32768), served alike; then it continues the
    # answer in a third request, which no longer fits (its messages alone leave less than R):
    # that one passes unchanged, vLLM refuses it and it gets OpenAI's window error, after
    # which the turn ends with what it has.
    w = p + ROOM
    served = envoy(stack, "qwen-served", window_tokens=w)
    with Tap(served.url) as tap:
        run = clis.qwen(tap.url, tmp_path / "served")
    assert [s.body["max_tokens"] for s in tap.sent] == [32768] * 3, tap.sent
    first, again, cont = (s.answer_headers for s in tap.sent)
    assert first["x-incontext-action"] == again["x-incontext-action"] == "rewritten", tap.sent
    q = int(first["x-incontext-prompt-tokens"])         # its working directory is another
    assert abs(q - p) <= 8 and int(again["x-incontext-prompt-tokens"]) == q, (p, q)
    assert int(first["x-incontext-max-tokens"]) == w - q, first
    assert tap.sent[2].status == 400 and cont["x-incontext-action"] == \
        "unchanged:insufficient", (tap.sent[2].status, cont)
    assert run.debug.count("Recovery attempt 1 failed") == 1, run.debug[-2000:]
    assert REACTIVE not in run.debug
    assert run.result["is_error"] is False, run.result
    usage = run.result["usage"]         # the two served calls
    assert usage["input_tokens"] == 2 * q, usage
    assert 0 < usage["output_tokens"] <= 2 * (w - q), usage
