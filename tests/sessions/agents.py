"""Scripted agents: multi-turn sessions that drive the official SDKs (and LiteLLM) the way an
agent does, and whose only compaction policy is to act on the window-full signals the client
library recognises (docs/spec.md §13):

* Anthropic: an error whose message contains "prompt is too long" → compact;
  "input length and `max_tokens` exceed context limit: X + Y > Z" → retry with
  `max_tokens` Z − X (what Claude Code does), compacting instead when nothing is left.
* OpenAI chat and Responses: `error.code == "context_length_exceeded"` → compact.
* LiteLLM: `litellm.ContextWindowExceededError` → compact.

Like Claude Code's, the agent's system prompt is most of the window (all but ROOM tokens of
"repository context"), so the conversation lives in the last ~4R tokens. Compaction is what an
agent's summary does, reduced to text: every earlier answer is cut to its first SUMMARY_CHARS
characters and the oldest exchange is dropped; the system prompt stays. Any other error is a
raw server error reaching the agent: the session records it and stops. Each turn appends a tool
result of about CHUNK tokens and asks for far more output than the window holds (32000, or no
cap for Codex's Responses), so every answer runs to the edge of the window and the next turn
crosses it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import List, Optional

import anthropic
import litellm
import openai

MODEL = "qwen3-tiny"
BIG = 32000             # Claude Code's max_tokens
ROOM = 122              # tokens of the window the system prompt leaves to the conversation
CHUNK = 24              # tokens of tool output per turn (" a" is one Qwen3 token)
MAX_ATTEMPTS = 12       # signals one turn may take before the session gives up
SUMMARY_CHARS = 40

def system_prompt(window: int) -> str:
    return "You are a terse coding agent. Answer from the tool output. Repository:" + \
        " a" * (window - ROOM)

_ANTHROPIC_PROMPT = "prompt is too long"
_ANTHROPIC_CAP = re.compile(
    r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")


@dataclass
class Answer:
    text: str
    input_tokens: int
    output_tokens: int
    cut: bool               # stopped by its cap or the window, not by the model
    stop: str
    cap_sent: Optional[int]


@dataclass
class Signal:
    kind: str               # "prompt_too_long" | "cap_too_long" | "context_length_exceeded"
    message: str
    retry_cap: Optional[int] = None


class RawError(Exception):
    """An error the agent cannot act on."""


@dataclass
class Turn:
    index: int
    signals: List[str] = field(default_factory=list)
    answer: Optional[Answer] = None
    error: Optional[str] = None


@dataclass
class Report:
    name: str
    turns: List[Turn] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def signals(self) -> int:
        return sum(len(t.signals) for t in self.turns)

    @property
    def answered(self) -> int:
        return sum(1 for t in self.turns if t.answer is not None)

    @property
    def output_tokens(self) -> int:
        return sum(t.answer.output_tokens for t in self.turns if t.answer)

    def line(self) -> str:
        return (f"{self.name}: {len(self.turns)} turns, {self.answered} answered, "
                f"{self.signals} window-full signals, {self.output_tokens} output tokens, "
                f"{self.seconds:.0f} s")


# How each library is pointed at Envoy (``envoy``: its address, e.g. http://127.0.0.1:10000;
# docs/agents.md shows these functions verbatim).
def anthropic_client(envoy: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=envoy, api_key="x", max_retries=0, timeout=180)


def openai_client(envoy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=envoy + "/v1", api_key="x", max_retries=0, timeout=180)


def litellm_completion(envoy: str, **request):
    return litellm.completion(model=f"openai/{MODEL}", api_base=envoy + "/v1", api_key="x",
                              num_retries=0, timeout=180, **request)


def short(text: str) -> str:
    return text[:SUMMARY_CHARS] or "(done)"


class Agent:
    """One session's conversation and how it reaches the model through one client library."""

    name = "agent"

    def __init__(self, url: str, tag: str, window: int):
        self.url = url
        self.tag = tag
        self.system = system_prompt(window)
        self.exchanges: List[list] = []     # [user text, answer text or None]

    # --- the client library ---------------------------------------------------------------
    def send(self, cap: Optional[int]):
        """One request with the conversation: an Answer or a Signal; raises RawError."""
        raise NotImplementedError

    def default_cap(self) -> Optional[int]:
        return BIG

    # --- the policy -----------------------------------------------------------------------
    def compact(self) -> bool:
        """Summarise every earlier answer and drop the oldest exchange."""
        if len(self.exchanges) <= 1:
            return False
        for ex in self.exchanges[:-1]:
            if ex[1] is not None:
                ex[1] = short(ex[1])
        self.exchanges.pop(0)
        return True

    def run(self, turns: int) -> Report:
        report = Report(f"{self.name}[{self.tag}]")
        t0 = time.monotonic()
        for i in range(turns):
            turn = Turn(i)
            report.turns.append(turn)
            self.exchanges.append([f"Tool output {self.tag}-{i}:" + " a" * CHUNK, None])
            cap = self.default_cap()
            for _ in range(MAX_ATTEMPTS):
                try:
                    out = self.send(cap)
                except RawError as e:
                    turn.error = str(e)
                    break
                if isinstance(out, Answer):
                    turn.answer = out
                    self.exchanges[-1][1] = out.text
                    break
                turn.signals.append(out.kind)
                if out.retry_cap is not None and out.retry_cap > 0 and cap != out.retry_cap:
                    cap = out.retry_cap
                elif not self.compact():
                    turn.error = f"nothing left to compact after: {out.message[:200]}"
                    break
                else:
                    cap = self.default_cap()
            else:
                turn.error = f"still no answer after {MAX_ATTEMPTS} signals"
            if turn.answer is None:
                break
        report.seconds = time.monotonic() - t0
        return report

    # --- shapes ---------------------------------------------------------------------------
    def chat_messages(self) -> list:
        out = [{"role": "system", "content": self.system}]
        for user, answer in self.exchanges:
            out.append({"role": "user", "content": user})
            if answer is not None:
                out.append({"role": "assistant", "content": answer or "(done)"})
        return out


def _raw(e: Exception) -> RawError:
    status = getattr(e, "status_code", None)
    return RawError(f"{type(e).__name__} {status}: {str(e)[:300]}")


class AnthropicAgent(Agent):
    """The `anthropic` SDK on /v1/messages, streamed, max_tokens 32000 (Claude Code's way)."""

    name = "anthropic"

    def __init__(self, url, tag, window):
        super().__init__(url, tag, window)
        self.client = anthropic_client(url)

    def messages(self):
        out = []
        for user, answer in self.exchanges:
            out.append({"role": "user", "content": user})
            if answer is not None:
                out.append({"role": "assistant", "content": answer or "(done)"})
        return out

    def send(self, cap):
        try:
            with self.client.messages.stream(model=MODEL, max_tokens=cap, system=self.system,
                                             messages=self.messages()) as stream:
                msg = stream.get_final_message()
        except anthropic.BadRequestError as e:
            text = str(e)
            if _ANTHROPIC_PROMPT in text.lower():
                return Signal("prompt_too_long", text)
            m = _ANTHROPIC_CAP.search(text)
            if m:
                x, _, z = (int(g) for g in m.groups())
                return Signal("cap_too_long", text, retry_cap=z - x)
            raise _raw(e) from None
        except anthropic.APIError as e:
            raise _raw(e) from None
        text = "".join(b.text for b in msg.content if b.type == "text")
        usage = msg.usage
        input_tokens = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        return Answer(text, input_tokens, usage.output_tokens,
                      msg.stop_reason in ("max_tokens", "model_context_window_exceeded"),
                      str(msg.stop_reason), cap)


class OpenAIChatAgent(Agent):
    """The `openai` SDK on /v1/chat/completions, max_tokens 32000."""

    name = "openai-chat"

    def __init__(self, url, tag, window):
        super().__init__(url, tag, window)
        self.client = openai_client(url)

    def send(self, cap):
        try:
            done = self.client.chat.completions.create(model=MODEL, max_tokens=cap,
                                                       messages=self.chat_messages())
        except openai.BadRequestError as e:
            if e.code == "context_length_exceeded":
                return Signal("context_length_exceeded", str(e))
            raise _raw(e) from None
        except openai.APIError as e:
            raise _raw(e) from None
        choice = done.choices[0]
        return Answer(choice.message.content or "", done.usage.prompt_tokens,
                      done.usage.completion_tokens, choice.finish_reason == "length",
                      choice.finish_reason, cap)


class ResponsesAgent(Agent):
    """The `openai` SDK on /v1/responses as Codex CLI sends it: streamed, `store: false`, no
    `max_output_tokens`."""

    name = "openai-responses"

    def __init__(self, url, tag, window):
        super().__init__(url, tag, window)
        self.client = openai_client(url)

    def default_cap(self):
        return None

    def send(self, cap):
        items = []
        for user, answer in self.exchanges:
            items.append({"role": "user", "content": user})
            if answer is not None:
                items.append({"role": "assistant", "content": answer or "(done)"})
        extra = {} if cap is None else {"max_output_tokens": cap}
        try:
            final = None
            for event in self.client.responses.create(model=MODEL, instructions=self.system,
                                                      input=items, store=False, stream=True,
                                                      **extra):
                if event.type in ("response.completed", "response.incomplete",
                                  "response.failed"):
                    final = event.response
        except openai.BadRequestError as e:
            if e.code == "context_length_exceeded":
                return Signal("context_length_exceeded", str(e))
            raise _raw(e) from None
        except openai.APIError as e:
            raise _raw(e) from None
        if final is None or final.usage is None:
            raise RawError("the stream ended without a final response")
        if final.status == "failed":
            raise RawError(f"response failed: {final.error}")
        return Answer(final.output_text or "", final.usage.input_tokens,
                      final.usage.output_tokens, final.status == "incomplete",
                      str(final.status), cap)


class LiteLLMAgent(Agent):
    """LiteLLM's `completion` with an OpenAI-compatible provider pointed at Envoy."""

    name = "litellm"

    def send(self, cap):
        try:
            done = litellm_completion(self.url, max_tokens=cap, messages=self.chat_messages())
        except litellm.ContextWindowExceededError as e:
            return Signal("context_length_exceeded", str(e))
        except Exception as e:  # noqa: BLE001 - every other error is one the agent cannot act on
            raise _raw(e) from None
        choice = done.choices[0]
        return Answer(choice.message.content or "", done.usage.prompt_tokens,
                      done.usage.completion_tokens, choice.finish_reason == "length",
                      choice.finish_reason, cap)


AGENTS = {a.name: a for a in (AnthropicAgent, OpenAIChatAgent, ResponsesAgent, LiteLLMAgent)}
