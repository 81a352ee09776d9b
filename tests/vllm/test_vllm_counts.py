"""The filter's prompt count equals vLLM's own usage.prompt_tokens for many chat shapes.

Every request goes through Envoy + incontext to the real vLLM; the filter's count (header
`x-incontext-prompt-tokens`) must equal the `usage.prompt_tokens` vLLM reports for the very
request it received, with source `exact` the first time and `cache` on an identical repeat.
Small caller caps (a kept cap smaller than R) keep the generations short; the long
multi-turn shape sends an oversized cap and must be rewritten to C - P.
"""

import copy
import json

import pytest

from tests.harness.cases import SYSTEM, TOOLS, assistant, user
from tests.vllm.stack import C, COUNT_LOG, MODEL, direct_post, fit_messages

NON_ASCII = ("Grüße aus Köln: café, naïve, façade — “quotes”, ‘single’, «guillemets» … "
             "emoji 🚀🎉👩‍💻, Русский текст, العربية, עברית, ελληνικά, हिन्दी.")
CJK = ("你好，世界！请用一句话总结这段文字。これは日本語のテキストです。カタカナとひらがな。"
       "한국어 문장도 있습니다. 全角：ＡＢＣ１２３。")
ESCAPES = ('Quotes " and backslashes \\ and a tab\tand\nnewlines\r\n, a NUL-free control '
           '\u0007 bell, slash / and unicode é 漢 🚀 — sent with \\u escapes.')


def tool_history(n, reasoning_key=None):
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "get_weather",
                                         "arguments": json.dumps({"city": "Köln", "unit": "c"})}}]}
    if reasoning_key:
        call[reasoning_key] = f"The user wants the weather; I should call get_weather ({n})."
    return [SYSTEM, user(f"What's the weather in Köln? ({n})"), call,
            {"role": "tool", "tool_call_id": "call_1",
             "content": json.dumps({"temp": 21, "sky": "clear"})}]


def chat(n, messages=None, **extra):
    body = {"model": MODEL,
            "messages": messages if messages is not None else [SYSTEM, user(f"Hello ({n})")],
            "max_tokens": 4, "temperature": 0}
    body.update(extra)
    return body


# shape id -> (path, body builder, send with ensure_ascii)
SHAPES = {
    "user-only": lambda n: chat(n, [user(f"Hello there ({n})")]),
    "system+user": lambda n: chat(n),
    "non-ascii": lambda n: chat(n, [SYSTEM, user(f"{NON_ASCII} ({n})")]),
    "cjk": lambda n: chat(n, [{"role": "system", "content": "你是一个简洁的助手。"},
                              user(f"{CJK} ({n})")]),
    "json-escapes-ascii-body": lambda n: chat(n, [SYSTEM, user(f"{ESCAPES} ({n})")]),
    "content-parts": lambda n: chat(n, [SYSTEM, {"role": "user", "content": [
        {"type": "text", "text": f"First part ({n})."}, {"type": "text", "text": "Second part."}]}]),
    "multi-turn": lambda n: chat(n, [SYSTEM, user(f"Hi ({n})"), assistant("Hello! How can I help?"),
                                     user("Name three rivers."), assistant("Rhine, Danube, Elbe."),
                                     user("And their lengths?")]),
    "tools+tool_choice-auto": lambda n: chat(n, [SYSTEM, user(f"Weather in Paris? ({n})")],
                                             tools=TOOLS, tool_choice="auto"),
    "tools-no-tool_choice": lambda n: chat(n, [SYSTEM, user(f"Weather in Rome? ({n})")],
                                           tools=TOOLS),
    "tool-call-history": lambda n: chat(n, tool_history(n), tools=TOOLS, tool_choice="auto"),
    "assistant-reasoning_content": lambda n: chat(n, tool_history(n, "reasoning_content"),
                                                  tools=TOOLS),
    "assistant-reasoning": lambda n: chat(n, tool_history(n, "reasoning"), tools=TOOLS),
    "reasoning-in-earlier-turn": lambda n: chat(n, [
        SYSTEM, user(f"2+2? ({n})"),
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
        user("And 3+3?")]),
    "reasoning_effort-none": lambda n: chat(n, reasoning_effort="none"),
    "reasoning_effort-low": lambda n: chat(n, reasoning_effort="low"),
    "reasoning_effort-high": lambda n: chat(n, reasoning_effort="high"),
    "chat_template_kwargs-enable_thinking-false": lambda n: chat(
        n, chat_template_kwargs={"enable_thinking": False}),
    "documents": lambda n: chat(n, [SYSTEM, user(f"What does the manual say? ({n})")], documents=[
        {"title": "Manual", "text": "Press the red button to stop the machine."},
        {"title": "FAQ", "text": "The blue button starts it again."}]),
    "continue_final_message": lambda n: chat(
        n, [SYSTEM, user(f"Count to five ({n})"), assistant("One, two,")],
        add_generation_prompt=False, continue_final_message=True),
    "add_generation_prompt-false": lambda n: chat(n, add_generation_prompt=False),
    "max_completion_tokens": lambda n: {k: v for k, v in chat(
        n, max_completion_tokens=4).items() if k != "max_tokens"},
    "max_output_tokens-on-chat": lambda n: {k: v for k, v in chat(
        n, max_output_tokens=4).items() if k != "max_tokens"},
    "string-cap": lambda n: chat(n, max_tokens="4"),
    "stream+include_usage": lambda n: chat(n, stream=True,
                                           stream_options={"include_usage": True}),
    # Sent pretty-printed (indent=2): white space and line breaks between every token, across
    # many 64-byte blocks of the payload's block-wise compactor.
    "pretty-printed-tool-history": lambda n: chat(n, tool_history(n), tools=TOOLS),
    # Pretty-printed and all non-ASCII as \u escapes, with a reasoning_content to rename: the
    # compactor's slower path (strings decoded and rewritten, messages one by one).
    "pretty-printed-ascii-reasoning_content": lambda n: chat(
        n, tool_history(f"{n} {NON_ASCII}", "reasoning_content"), tools=TOOLS),
}
ASCII_BODY = {"json-escapes-ascii-body", "pretty-printed-ascii-reasoning_content"}
PRETTY = {"pretty-printed-tool-history", "pretty-printed-ascii-reasoning_content"}

COMPLETIONS = {
    "completion-string-prompt": lambda n: {"model": MODEL, "prompt": f"Once upon a time ({n})",
                                           "max_tokens": 4, "temperature": 0},
    "completion-cjk-prompt": lambda n: {"model": MODEL, "prompt": f"{CJK} ({n})",
                                        "max_tokens": 4, "temperature": 0},
    "completion-token-ids": lambda n: {"model": MODEL,
                                       "prompt": [9707, 11, 1879, 0] + [264] * (len(n) + 20),
                                       "max_tokens": 4, "temperature": 0},
}

# Shapes a release refuses on its own (400 straight from vLLM, whatever the filter does), with
# the text of vLLM's error. Through the filter they must meet the same 400, not another error.
REFUSED_BY_RELEASE = {
    # reasoning_effort: 'low' | 'medium' | 'high' only; "none" arrived later.
    "0.11.0": {"reasoning_effort-none": "Input should be 'low', 'medium' or 'high'"},
}

LEARNED_SUBSET = ["system+user", "cjk", "tools+tool_choice-auto", "tool-call-history",
                  "reasoning_effort-none", "documents", "continue_final_message"]


def caller_cap(body):
    caps = [int(body[k]) for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
            if k in body]
    return min(caps) if caps else None


def check_refused_by_release(vllm, client, shape, body, path="/v1/chat/completions"):
    """The release refuses this shape itself: straight and through the filter alike."""
    message = REFUSED_BY_RELEASE[vllm.release][shape]
    direct = direct_post(vllm, body, path)
    assert direct.status_code == 400 and message in direct.text, direct.text[:300]
    res = client.post(copy.deepcopy(body), path)
    assert res.status == 400 and message in res.resp.text, res.describe()


def check_exact_then_cache(client, config, shape, body, path="/v1/chat/completions",
                           ensure_ascii=False, repeat_source="cache", indent=None):
    first = client.post(copy.deepcopy(body), path, ensure_ascii=ensure_ascii, indent=indent)
    assert first.status == 200, first.describe()
    usage = first.usage
    COUNT_LOG.append((config, shape, first.prompt_tokens_header, usage["prompt_tokens"]))
    assert first.source == "exact", first.describe()
    assert first.prompt_tokens_header == usage["prompt_tokens"], (
        f"{shape}: filter counted {first.prompt_tokens_header}, vLLM usage.prompt_tokens "
        f"{usage['prompt_tokens']}; {first.describe()}")
    assert first.action == "rewritten", first.describe()
    b = caller_cap(body)
    want = C - usage["prompt_tokens"] if b is None else min(C - usage["prompt_tokens"], b)
    assert first.max_tokens_header == want, first.describe()
    assert usage["completion_tokens"] <= want, usage

    again = client.post(copy.deepcopy(body), path, ensure_ascii=ensure_ascii, indent=indent)
    assert again.status == 200, again.describe()
    assert again.source == repeat_source, again.describe()
    assert again.prompt_tokens_header == again.usage["prompt_tokens"] == usage["prompt_tokens"], (
        again.describe())
    return first


@pytest.mark.parametrize("shape", list(SHAPES))
def test_chat_count_equals_vllm_usage(vllm, exact, shape):
    body = SHAPES[shape](f"{shape}-exact")
    if shape in REFUSED_BY_RELEASE.get(vllm.release, {}):
        return check_refused_by_release(vllm, exact, shape, body)
    check_exact_then_cache(exact, f"{vllm.release} C=512", shape, body,
                           ensure_ascii=shape in ASCII_BODY,
                           indent=2 if shape in PRETTY else None)


@pytest.mark.parametrize("shape", list(COMPLETIONS))
def test_completion_count_equals_vllm_usage(vllm, exact, shape):
    body = COMPLETIONS[shape](f"{shape}-exact")
    ids = isinstance(body["prompt"], list)
    first = check_exact_then_cache(exact, f"{vllm.release} C=512", shape, body, "/v1/completions",
                                   repeat_source="exact" if ids else "cache")
    if ids:   # counted by length: no tokenizer call at all
        assert first.delta.get("incontext_tokenizer_calls", 0) == 0, first.describe()


@pytest.mark.parametrize("shape", LEARNED_SUBSET)
def test_chat_count_equals_vllm_usage_learned_window(vllm, learned, shape):
    body = SHAPES[shape](f"{shape}-learned")
    if shape in REFUSED_BY_RELEASE.get(vllm.release, {}):
        return check_refused_by_release(vllm, learned, shape, body)
    check_exact_then_cache(learned, f"{vllm.release} learned", shape, body)


def test_long_multi_turn_oversized_cap_rewritten_to_rest_of_window(vllm, exact):
    turns = [
        "Explain how a bicycle gear works.",
        "The chain moves between sprockets of different sizes; a larger rear sprocket makes "
        "pedalling easier but slower, a smaller one harder but faster.",
        "What about the front derailleur?",
        "It moves the chain between the chainrings; together with the rear cassette it gives "
        "the range of ratios. Avoid cross-chaining: big-big or small-small.",
        "Why is cross-chaining bad?",
        "The chain runs at a steep angle, wears faster, is noisier and may drop.",
    ]

    def build(filler):
        msgs = [SYSTEM]
        for i, t in enumerate(turns):
            msgs.append(user(t) if i % 2 == 0 else assistant(t))
        msgs.append(user("Summarise everything in one sentence, please." + filler))
        return msgs

    msgs, p = fit_messages(vllm, 420, build)
    body = {"model": MODEL, "messages": msgs, "max_tokens": 100000, "temperature": 0}
    first = check_exact_then_cache(exact, f"{vllm.release} C=512", "long-multi-turn(420)", body)
    assert first.max_tokens_header == C - p

