"""The llama-server contract the llamacpp tokenizer backend relies on, pinned against the real
server (no Envoy): where the window comes from, which call counts each dialect's prompt, and that
each count equals the server's own usage for the very same request.
"""

import pytest

from tests.llamacpp.cases import ANTHROPIC, CHAT, COMPLETIONS, TOOLS, with_cap
from tests.llamacpp.stack import MODEL, anthropic_prompt_tokens

CTX = 512       # scripts/llamacpp.sh: --ctx-size 512 --parallel 1
BIG_CAP = 32768


def test_props_reports_the_slot_window(llama):
    props = llama.props()
    assert props["default_generation_settings"]["n_ctx"] == CTX, props
    # one slot: the slot's window is the whole context
    assert props["total_slots"] == 1, props


@pytest.mark.parametrize("case", list(CHAT))
def test_chat_input_tokens_equal_usage(llama, case):
    """/v1/chat/completions/input_tokens with the request as sent (oversized cap included)
    answers the prompt_tokens the same request then reports in its usage."""
    count = llama.chat_input_tokens(with_cap(CHAT[case], BIG_CAP))
    reply = llama.post_ok("/v1/chat/completions", with_cap(CHAT[case], 2, temperature=0))
    assert count == reply["usage"]["prompt_tokens"], (count, reply["usage"])
    # The count is the chat template's rendering tokenized, tools included.
    prompt = llama.post_ok("/apply-template", CHAT[case])["prompt"]
    assert count == len(llama.tokenize(prompt))


def test_chat_input_tokens_include_the_tools(llama):
    body = CHAT["tools+tool-history"]
    without = {k: v for k, v in body.items() if k != "tools"}
    with_tools = llama.chat_input_tokens(body)
    bare = llama.chat_input_tokens(without)
    tool_text = len(llama.tokenize("".join(t["function"]["description"] for t in TOOLS)))
    assert with_tools > bare + tool_text, (with_tools, bare, tool_text)


def test_chat_input_tokens_apply_chat_template_kwargs(llama):
    off = CHAT["thinking-off"]
    default = {k: v for k, v in off.items() if k != "chat_template_kwargs"}
    think_block = len(llama.tokenize("<think>\n\n</think>\n\n"))
    assert llama.chat_input_tokens(off) == llama.chat_input_tokens(default) + think_block


def test_chat_usage_counts_cached_prompt_tokens(llama):
    """OpenAI-shaped usage reports the whole prompt even when the slot's prompt cache served
    most of it (prompt_tokens_details.cached_tokens)."""
    body = with_cap(CHAT["multi-turn"], 2, temperature=0)
    first = llama.post_ok("/v1/chat/completions", body)["usage"]
    second = llama.post_ok("/v1/chat/completions", body)["usage"]
    assert second["prompt_tokens"] == first["prompt_tokens"], (first, second)
    assert second["prompt_tokens_details"]["cached_tokens"] > 0, second


@pytest.mark.parametrize("case", list(COMPLETIONS))
def test_tokenize_content_equals_completions_usage(llama, case):
    prompt = COMPLETIONS[case]
    tokens = llama.tokenize(prompt)
    reply = llama.post_ok("/v1/completions",
                          {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0})
    assert len(tokens) == reply["usage"]["prompt_tokens"], (len(tokens), reply["usage"])


def test_tokenize_add_special_adds_nothing_for_this_model(llama):
    """/tokenize defaults to add_special false, completions tokenize with add_special true.
    The Qwen3 GGUF has add_bos_token false, so both give the same tokens: the backend may send
    `content` alone."""
    prompt = COMPLETIONS["plain"]
    plain = llama.tokenize(prompt)
    special = llama.tokenize(prompt, add_special=True)
    assert special == plain
    bos = llama.tokenize("<|endoftext|>")
    assert len(bos) == 1 and bos[0] not in plain


def test_tokenize_reads_content_only(llama):
    """/tokenize reads `content`; a vLLM-shaped `prompt` field is ignored and answered with no
    tokens (HTTP 200), so a count from the wrong payload would silently be 0."""
    assert llama.post_ok("/tokenize", {"prompt": COMPLETIONS["plain"]})["tokens"] == []
    assert len(llama.tokenize(COMPLETIONS["plain"])) > 0


def test_tokenize_parses_special_token_text(llama):
    """Text that spells a special token counts as that one token in /tokenize and in the
    completion prompt alike (parse_special defaults to true)."""
    text = COMPLETIONS["special-token-text"]
    parsed = llama.tokenize(text)
    literal = llama.tokenize(text, parse_special=False)
    assert len(parsed) < len(literal)


@pytest.mark.parametrize("case", list(ANTHROPIC))
def test_anthropic_count_tokens_equals_usage(llama, case):
    """/v1/messages/count_tokens equals the prompt /v1/messages reports, which is
    input_tokens + cache_read_input_tokens (llama-server splits off the cached part)."""
    count = llama.anthropic_count(with_cap(ANTHROPIC[case], 32000))
    reply = llama.post_ok("/v1/messages", with_cap(ANTHROPIC[case], 2, temperature=0))
    assert count == anthropic_prompt_tokens(reply["usage"]), (count, reply["usage"])
    # count_tokens needs no max_tokens
    bare = {k: v for k, v in ANTHROPIC[case].items()}
    assert llama.anthropic_count(bare) == count


def test_anthropic_usage_splits_off_the_cached_prompt(llama):
    body = with_cap(ANTHROPIC["multi-turn"], 2, temperature=0)
    count = llama.anthropic_count(body)
    llama.post_ok("/v1/messages", body)
    usage = llama.post_ok("/v1/messages", body)["usage"]
    assert usage["cache_read_input_tokens"] > 0, usage
    assert usage["input_tokens"] < count, usage
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == count, usage


def test_oversized_cap_is_served_until_the_window_is_full(llama):
    """llama-server does not reject max_tokens 32768 in a 512-token slot: it generates until the
    slot is full (prompt + completion == n_ctx; context shift is off by default) and stops with
    finish_reason "length"."""
    n_ctx = llama.n_ctx()
    body = with_cap(CHAT["system+user"], BIG_CAP, temperature=0)
    r = llama.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text[:400]
    reply = r.json()
    usage = reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "length", reply["choices"][0]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == n_ctx, usage


def test_prompt_beyond_the_window_is_rejected(llama):
    n_ctx = llama.n_ctx()
    long = " ".join(["word"] * (n_ctx + 50))
    body = {"model": MODEL, "messages": [{"role": "user", "content": long}], "max_tokens": 4}
    n = llama.chat_input_tokens(body)
    assert n > n_ctx
    r = llama.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text[:400]
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error", err
    assert err["n_prompt_tokens"] == n and err["n_ctx"] == n_ctx, err
