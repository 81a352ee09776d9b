"""The real agents through Envoy + incontext, offline, against the real vLLM 0.32 with a
12288-token window (`--enable-scale-out`; tests/sessions/conftest.py): Claude Code (`claude -p … --output-format json`,
ANTHROPIC_BASE_URL at Envoy) and Codex CLI (`codex exec` with a custom provider,
`wire_api = "responses"`), both installed pinned from npm by scripts/setup-sessions.sh. A
missing agent binary FAILS the test.

* Claude Code straight to vLLM: its `max_tokens` 32000 is above the window, vLLM answers 400 and
  Claude Code reports "API Error: 400 … cannot be greater than max_model_len=12288".
* Reject mode at a window its prompt overflows (`window_tokens` 8192 < its ~11.6k-token system
  prompt and tools): the filter answers Anthropic's "prompt is too long: P tokens > M maximum",
  and Claude Code makes its own "Prompt is too long" report from it (`terminal_reason`
  `prompt_too_long`). Codex CLI, given `context_length_exceeded`, reports that it ran out of
  room in the model's context window.
* Served through incontext: a window a little larger than the agent's prompt (`window_tokens` =
  P + ROOM, P read from the reject run), so the answer is short on this CPU: the filter rewrites
  the cap to W − P and the request is served. Codex finishes its turn; Claude Code continues a
  conversation the window ended (the random-weight model never ends an answer itself) and then
  gets its own "Prompt is too long", never vLLM's raw 400.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.clients.stack import MODEL
from tests.sessions.conftest import WINDOW

SMALL = 8192            # a window both agents' prompts overflow
ROOM = 256              # output room of the served runs
R = 64
AGENTS_DIR = Path(os.environ.get("INCONTEXT_AGENTS_DIR",
                                 Path.home() / ".cache" / "incontext" / "agents"))
CLAUDE = AGENTS_DIR / "node_modules" / ".bin" / "claude"
CODEX = AGENTS_DIR / "node_modules" / ".bin" / "codex"


@pytest.fixture(scope="module")
def agent_stack(vllm, stack):
    for binary in (CLAUDE, CODEX):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run scripts/setup-sessions.sh", pytrace=False)
    return vllm, stack


def envoy(stack, name, **changes):
    return stack.envoy(name, context_length=WINDOW, min_output_tokens=R, **changes)


def prompt_of(env, what) -> int:
    """P of the last request the filter decided, from its debug log line (counts only; Envoy
    writes its log file out within seconds)."""
    for _ in range(40):
        found = re.findall(r"incontext: (?:rejected|rewritten) prompt=(\d+)",
                           env.log_path.read_text(errors="replace"))
        if found:
            return int(found[-1])
        time.sleep(0.5)
    raise AssertionError(f"no decision logged by the filter for {what}")


# --- Claude Code ---------------------------------------------------------------------------
def claude(base_url: str, workdir: Path, prompt="Say hello.") -> dict:
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "x",
        "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "ANTHROPIC_DEFAULT_SONNET_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": MODEL,
        # offline: no telemetry, updates, error reports or other non-essential traffic
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
    }
    out = subprocess.run([str(CLAUDE), "-p", prompt, "--output-format", "json", "--model",
                          MODEL, "--max-turns", "1"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"claude printed no JSON (exit {out.returncode}): {out.stdout[-500:]} " \
                  f"{out.stderr[-500:]}"
    return json.loads(lines[-1])


def brief(result: dict) -> dict:
    return {k: result.get(k) for k in ("is_error", "api_error_status", "terminal_reason",
                                        "num_turns", "result", "usage")}


def test_claude_code_straight_to_vllm_gets_its_400(agent_stack, tmp_path):
    server, _ = agent_stack
    result = claude(server.url, tmp_path)
    assert result["is_error"] is True, brief(result)
    assert result.get("api_error_status") == 400, brief(result)
    assert f"cannot be greater than max_model_len={WINDOW}" in result["result"], brief(result)


def test_claude_code_prompt_too_long_in_reject_mode_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "claude-reject", window_tokens=SMALL, on_insufficient="reject")
    result = claude(reject.url, tmp_path / "reject")
    assert result["is_error"] is True, brief(result)
    assert result.get("terminal_reason") == "prompt_too_long", brief(result)
    assert result["result"].startswith("Prompt is too long"), brief(result)
    m = re.search(r"~(\d+) tokens \(limit (\d+)\)", result["result"])
    assert m and int(m.group(2)) == SMALL - R, result["result"]
    p = prompt_of(reject, "Claude Code's request")
    assert int(m.group(1)) == p, (m.group(0), p)

    served = envoy(stack, "claude-served", window_tokens=p + ROOM)
    result = claude(served.url, tmp_path / "served")
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
def codex(base_url: str, workdir: Path, prompt="Say hello.") -> list:
    home = workdir / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "CODEX_HOME": str(home), "INCONTEXT_API_KEY": "x"}
    provider = "model_providers.incontext"
    args = [str(CODEX), "exec", "--json", "--skip-git-repo-check",
            "-c", "model_provider=incontext", "-c", f"model={MODEL}",
            "-c", f"{provider}.name=incontext",
            "-c", f'{provider}.base_url="{base_url}/v1"',
            "-c", f'{provider}.wire_api="responses"',
            "-c", f'{provider}.env_key="INCONTEXT_API_KEY"',
            "-c", f"{provider}.request_max_retries=0",
            "-c", f"{provider}.stream_max_retries=0",
            prompt]
    out = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL)
    events = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert events, f"codex printed no events (exit {out.returncode}): {out.stderr[-500:]}"
    return events


def test_codex_context_window_in_reject_mode_then_served(agent_stack, tmp_path):
    _, stack = agent_stack
    reject = envoy(stack, "codex-reject", window_tokens=SMALL, on_insufficient="reject")
    events = codex(reject.url, tmp_path / "reject")
    failed = [e for e in events if e.get("type") == "turn.failed"]
    assert failed, events[-3:]
    assert "ran out of room in the model's context window" in failed[-1]["error"]["message"], \
        failed[-1]
    p = prompt_of(reject, "Codex's request")
    assert p > SMALL - R, p

    served = envoy(stack, "codex-served", window_tokens=p + ROOM)
    events = codex(served.url, tmp_path / "served")
    done = [e for e in events if e.get("type") == "turn.completed"]
    assert done, events[-3:]
    usage = done[-1]["usage"]
    assert usage["input_tokens"] == p, usage
    assert 0 < usage["output_tokens"] <= ROOM, usage
    assert prompt_of(served, "Codex's request") == p
