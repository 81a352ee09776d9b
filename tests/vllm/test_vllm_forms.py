"""Which forms of a message vLLM renders alike (docs/spec.md §15b), shown on the real server.

A conversation's earlier count is reused only where its messages are a prefix of the new
request's in their canonical form (crates/core/src/dialect/canonical.rs): the message's own
bytes with `cache_control` taken out of it and of its content blocks, and a lone text block
written as its text. Each pair below is a form an agent or SDK sends
(Claude Code writes its newest message as a text block with `cache_control` and the same
message as a string on the next turn; the `openai` SDK and LiteLLM send a string or a text
part; Qwen Code's and LiteLLM's caching put `cache_control` on parts and messages) and its
other form. For each: vLLM's own count of the two is the same, and through Envoy + incontext
a conversation counted in one form is bounded, not counted whole, on its next turn in the
other, the bound at least vLLM's count of that turn.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.vllm.stack import MODEL

CACHE = {"type": "ephemeral"}

# (name, message in the form of the counted turn, the same message as the next turn sends it)
CHAT_PAIRS = [
    ("string_and_text_part",
     {"role": "user", "content": "Read the file and fix the bug."},
     {"role": "user", "content": [{"type": "text", "text": "Read the file and fix the bug."}]}),
    ("text_part_with_cache_control",
     {"role": "user", "content": [{"type": "text", "text": "Explain the diff.",
                                   "cache_control": CACHE}]},
     {"role": "user", "content": "Explain the diff."}),
    ("message_cache_control",
     {"role": "user", "content": "Run the tests.", "cache_control": CACHE},
     {"role": "user", "content": "Run the tests."}),
    ("system_part_with_cache_control",
     {"role": "system", "content": [{"type": "text", "text": "You are a coding agent.",
                                     "cache_control": CACHE}]},
     {"role": "system", "content": "You are a coding agent."}),
    ("assistant_text_part",
     {"role": "assistant", "content": [{"type": "text", "text": "Done: the test passes."}]},
     {"role": "assistant", "content": "Done: the test passes."}),
    ("tool_text_part",
     {"role": "tool", "tool_call_id": "call_1",
      "content": [{"type": "text", "text": "exit 0", "cache_control": CACHE}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "exit 0"}),
]

ANTHROPIC_PAIRS = [
    ("claude_code_newest_message",
     {"role": "user", "content": [{"type": "text", "text": "Fix the failing test.",
                                   "cache_control": CACHE}]},
     {"role": "user", "content": "Fix the failing test."}),
    ("cache_control_moves_on",
     {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ok</system-reminder>"},
                                  {"type": "text", "text": "Go on.", "cache_control": CACHE}]},
     {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ok</system-reminder>"},
                                  {"type": "text", "text": "Go on."}]}),
    ("tool_result_with_cache_control",
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                   "content": "3 files changed", "cache_control": CACHE}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                   "content": "3 files changed"}]}),
    ("assistant_text_block",
     {"role": "assistant", "content": [{"type": "text", "text": "I will read it first."}]},
     {"role": "assistant", "content": "I will read it first."}),
]

TOOL_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "shell",
                                                      "arguments": "{\"cmd\": \"make test\"}"}}]}
TOOL_USE = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": "git diff"}}]}


def chat_history(name: str, message: dict) -> list:
    """A conversation that holds ``message`` where its role may stand (a unique opening so
    that no other test's count is a prefix of it)."""
    opening = {"role": "user", "content": f"Session {name}."}
    if message["role"] == "system":
        return [message, opening]
    if message["role"] == "tool":
        return [opening, TOOL_CALL, message]
    return [opening, {"role": "assistant", "content": "Ok."}, message] \
        if message["role"] == "user" else [opening, message]


def anthropic_history(name: str, message: dict) -> list:
    opening = {"role": "user", "content": f"Session {name}."}
    if message["role"] == "assistant":
        return [opening, message]
    if isinstance(message["content"], list) and message["content"][0]["type"] == "tool_result":
        return [opening, TOOL_USE, message]
    return [opening, {"role": "assistant", "content": "Ok."}, message]


def anthropic_count(vllm, messages: list) -> int:
    r = httpx.post(vllm.url + "/v1/messages/count_tokens",
                   json={"model": MODEL, "messages": messages, "max_tokens": 16}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    return r.json()["input_tokens"]


def grown(history: list, step: str) -> list:
    """The next turn: the history, then the assistant's answer and a new user message."""
    if history[-1]["role"] == "assistant":
        return history + [{"role": "user", "content": f"Now {step}."}]
    return history + [{"role": "assistant", "content": "Looking."},
                      {"role": "user", "content": f"Now {step}."}]


def check_bounded(reply, exact: int):
    assert reply.status == 200, reply.describe()
    assert reply.source == "bound", reply.describe()
    assert reply.delta.get("incontext_count_calls", 0) == 0, reply.describe()
    assert reply.prompt_tokens_header >= exact, reply.describe()


@pytest.mark.parametrize("name,counted,again", CHAT_PAIRS, ids=[p[0] for p in CHAT_PAIRS])
def test_chat_forms_render_alike_and_keep_their_prefix(vllm, exact, name, counted, again):
    first, second = chat_history(name, counted), chat_history(name, again)
    assert vllm.count_chat(first) == vllm.count_chat(second)
    # Through the filter: the first form counted, the next turn in the other form bounded.
    body = {"model": MODEL, "max_tokens": 16, "messages": first}
    reply = exact.post_head(body, "/v1/chat/completions")
    assert reply.source == "exact", reply.describe()
    nxt = grown(second, "commit it")
    reply = exact.post_head({"model": MODEL, "max_tokens": 16, "messages": nxt},
                            "/v1/chat/completions")
    check_bounded(reply, vllm.count_chat(nxt))


def test_a_message_written_otherwise_is_counted_whole(vllm, exact):
    """White space and escapes are not read away: vLLM renders a re-spaced, re-escaped
    conversation alike, but its messages' canonical forms differ from the counted ones, so the
    next turn is counted whole (a count more, never a wrong bound). No agent re-spaces its
    history (bench/sessions/recorded)."""
    messages = [{"role": "user", "content": "Ünïcode \"quoted\" / slash (forms)."}]
    compact = json.dumps({"model": MODEL, "max_tokens": 16, "messages": messages},
                         ensure_ascii=False).encode()
    spaced = json.dumps({"model": MODEL, "max_tokens": 16, "messages": messages},
                        ensure_ascii=True, indent=2).encode()
    assert compact != spaced
    counts = [vllm.tokenize({"model": MODEL, "add_generation_prompt": True,
                             "messages": json.loads(raw)["messages"]})["count"]
              for raw in (compact, spaced)]
    assert counts[0] == counts[1]
    first = exact.post(json.loads(compact))
    assert first.source == "exact", first.describe()
    nxt = messages + [{"role": "assistant", "content": "Ok."},
                      {"role": "user", "content": "And again."}]
    reply = exact.post({"model": MODEL, "max_tokens": 16, "messages": nxt}, ensure_ascii=True,
                       indent=2)
    assert reply.source == "exact", reply.describe()
    assert reply.prompt_tokens_header == vllm.count_chat(nxt), reply.describe()


@pytest.mark.needs_messages_api
@pytest.mark.parametrize("name,counted,again", ANTHROPIC_PAIRS,
                         ids=[p[0] for p in ANTHROPIC_PAIRS])
def test_anthropic_forms_render_alike_and_keep_their_prefix(vllm, exact, name, counted, again):
    first, second = anthropic_history(name, counted), anthropic_history(name, again)
    assert anthropic_count(vllm, first) == anthropic_count(vllm, second)
    body = {"model": MODEL, "max_tokens": 16, "messages": first}
    reply = exact.post_head(body, "/v1/messages")
    assert reply.source == "exact", reply.describe()
    nxt = grown(second, "commit it")
    reply = exact.post_head({"model": MODEL, "max_tokens": 16, "messages": nxt}, "/v1/messages")
    check_bounded(reply, anthropic_count(vllm, nxt))


def test_a_message_sent_again_without_a_block_is_bounded_by_its_earlier_count(vllm, exact):
    """Qwen Code's newest message carries the date reminder as a block of its own and the
    next turn sends that message without it: vLLM renders it to fewer tokens, and the
    earlier count bounds it."""
    date = {"type": "text", "text": "<system-reminder>Today is Sunday.</system-reminder>"}
    first = [{"role": "system", "content": "You are Qwen Code (blocks)."},
             {"role": "user", "content": [date, {"type": "text", "text": "List the files."}]}]
    counted = exact.post_head({"model": MODEL, "max_tokens": 16, "messages": first},
                              "/v1/chat/completions")
    assert counted.source == "exact", counted.describe()
    nxt = [first[0], {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
           {"role": "assistant", "content": "main.py"},
           {"role": "user", "content": [date, {"type": "text", "text": "Read main.py."}]}]
    assert vllm.count_chat(nxt[:2]) < vllm.count_chat(first)
    reply = exact.post_head({"model": MODEL, "max_tokens": 16, "messages": nxt},
                            "/v1/chat/completions")
    check_bounded(reply, vllm.count_chat(nxt))
