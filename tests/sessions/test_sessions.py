"""Agent sessions through Envoy + incontext against the real vLLM: 15 turns each, every turn
adding a tool result, so the conversation runs into the window again and again. The
agents' only compaction policy is the window-full signal of their client library
(tests/sessions/agents.py). Every turn must end in an answer — one cut by its cap or the window
carries at least min(R, the cap sent) output tokens — after any number of signals the agent
acted on; never in a raw server error, never in an answer cut below R without the signal.

Passthrough mode (the default configuration) relies on the filter translating vLLM's own
window errors into the dialect's signal (docs/spec.md §13); reject mode on the filter answering
the signal itself.
"""

import pytest

from tests.sessions.agents import AGENTS
from tests.sessions.conftest import REPORTS, WINDOW as C

R = 32
F = 16
TURNS = 15
MIN_SIGNALS = 3

SESSIONS = [
    ("anthropic", "passthrough"),
    ("openai-chat", "passthrough"),
    ("openai-responses", "passthrough"),
    ("litellm", "passthrough"),
    ("anthropic", "reject"),
]


@pytest.mark.parametrize("agent,mode", SESSIONS, ids=[f"{a}-{m}" for a, m in SESSIONS])
def test_session_survives_the_window_edge_on_the_signal_alone(stack, agent, mode):
    envoy = stack.envoy(f"sessions-{mode}", context_length=C, min_output_tokens=R,
                        fallback_margin_tokens=F, on_insufficient=mode)
    report = AGENTS[agent](envoy.url, f"{agent}-{mode}", C).run(TURNS)
    REPORTS.append(report)
    for t in report.turns:
        assert t.error is None, (
            f"{report.name} turn {t.index} (after signals {t.signals}): the agent got an error "
            f"it cannot act on instead of the window-full signal (docs/spec.md §13): {t.error}")
        a = t.answer
        assert a.input_tokens + a.output_tokens <= C, (report.name, t.index, a)
        if a.cut:
            floor = R if a.cap_sent is None else min(R, a.cap_sent)
            assert a.output_tokens >= floor, (
                f"{report.name} turn {t.index}: an answer cut at {a.output_tokens} output "
                f"tokens (< {floor}) without the signal: {a}")
    assert report.answered == TURNS, report.line()
    assert report.signals >= MIN_SIGNALS, (
        f"{report.name}: the session crossed the window edge only {report.signals} times")
