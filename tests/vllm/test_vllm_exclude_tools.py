"""vLLM started with `--exclude-tools-when-tool-choice-none`, and the filter's mirror switch
`"exclude_tools_when_tool_choice_none": true` (docs/spec.md §5).

With the flag, vLLM renders a request whose `tool_choice` is exactly "none" without its
`tools`, so `usage.prompt_tokens` is the count of the messages alone; every other
`tool_choice` still renders the tools. vLLM's /tokenize ignores `tool_choice` (it counts the
tools it is given), so the filter must leave `tools` out of the payload itself.

Runs at the end (`pytest.mark.last`, phase 2), on the newest selected release only, on the
session's vLLM as the outage test (phase 1) restarted it: with the flag, same port and state
directory. Run without that test first, it restarts the server with the flag itself; the
session's teardown stops whichever runs.
"""

import pytest

from tests.harness.servers import start_or_fail
from tests.vllm.test_vllm_counts import SYSTEM, TOOLS, check_exact_then_cache, chat, tool_history, user
from tests.vllm.stack import EXCLUDE_TOOLS_FLAG, MODEL, Client, Vllm, direct_post, stream_usage

pytestmark = [pytest.mark.last, pytest.mark.newest_vllm_only, pytest.mark.phase(2)]


@pytest.fixture(scope="module")
def excluding_vllm(vllm):
    if EXCLUDE_TOOLS_FLAG in vllm.extra_args and vllm.healthy():
        return vllm   # restarted with the flag by test_vllm_outage.py
    vllm.stop()
    server = Vllm(vllm.state_dir, vllm.port, release=vllm.release, extra_args=(EXCLUDE_TOOLS_FLAG,))
    start_or_fail(server, f"vLLM {vllm.release} {EXCLUDE_TOOLS_FLAG}", stop_on_failure=False)
    vllm.start_seconds.extend(server.start_seconds)
    return server


@pytest.fixture
def excluding(stack, excluding_vllm) -> Client:
    return stack.client("exclude-tools", exclude_tools_when_tool_choice_none=True)


NONE_SHAPES = {
    "tool_choice-none": lambda n: chat(n, [SYSTEM, user(f"Weather in Oslo? ({n})")],
                                       tools=TOOLS, tool_choice="none"),
    "tool_choice-none-stream": lambda n: chat(
        n, [SYSTEM, user(f"Weather in Lima? ({n})")], tools=TOOLS, tool_choice="none",
        stream=True, stream_options={"include_usage": True}),
    "tool_choice-none-tool-history": lambda n: chat(n, tool_history(n), tools=TOOLS,
                                                    tool_choice="none"),
}
OTHER_SHAPES = {
    "tool_choice-auto": lambda n: chat(n, [SYSTEM, user(f"Weather in Bern? ({n})")],
                                       tools=TOOLS, tool_choice="auto"),
    "tools-no-tool_choice": lambda n: chat(n, [SYSTEM, user(f"Weather in Kyiv? ({n})")],
                                           tools=TOOLS),
    "tool_choice-required": lambda n: chat(n, [SYSTEM, user(f"Weather in Riga? ({n})")],
                                           tools=TOOLS, tool_choice="required"),
}


def usage_of(resp, body):
    assert resp.status_code == 200, resp.text[:300]
    return stream_usage(resp.text) if body.get("stream") else resp.json()["usage"]


@pytest.mark.parametrize("shape", list(NONE_SHAPES))
def test_vllm_leaves_tools_out_for_tool_choice_none(excluding_vllm, shape):
    """vLLM's behaviour, straight: usage is the count without tools; /tokenize with the tools
    still counts them (it does not read tool_choice)."""
    body = NONE_SHAPES[shape](f"{shape}-direct")
    usage = usage_of(direct_post(excluding_vllm, body), body)
    without = excluding_vllm.tokenize({"model": MODEL, "messages": body["messages"]})["count"]
    with_tools = excluding_vllm.tokenize({"model": MODEL, "messages": body["messages"],
                                          "tools": TOOLS, "tool_choice": "none"})["count"]
    assert usage["prompt_tokens"] == without < with_tools, (usage, without, with_tools)


@pytest.mark.parametrize("shape", list(OTHER_SHAPES))
def test_vllm_keeps_tools_for_other_tool_choices(excluding_vllm, shape):
    body = OTHER_SHAPES[shape](f"{shape}-direct")
    usage = usage_of(direct_post(excluding_vllm, body), body)
    with_tools = excluding_vllm.tokenize({"model": MODEL, "messages": body["messages"],
                                          "tools": TOOLS})["count"]
    assert usage["prompt_tokens"] == with_tools, (usage, with_tools)


@pytest.mark.parametrize("shape", list(NONE_SHAPES) + list(OTHER_SHAPES))
def test_switch_counts_equal_vllm_usage(excluding_vllm, excluding, shape):
    body = {**NONE_SHAPES, **OTHER_SHAPES}[shape](f"{shape}-exclude")
    check_exact_then_cache(excluding, f"{excluding_vllm.release} exclude-tools", shape, body)
