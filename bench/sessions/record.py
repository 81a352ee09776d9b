#!/usr/bin/env python3
"""Records real sessions of the agents tests/sessions runs — Claude Code, Codex CLI, OpenCode
and Qwen Code, pinned by scripts/setup-sessions.sh and configured as docs/agents.md shows
(tests/sessions/clis.py) — against the real vLLM, for bench/sessions/agents.py and
tests/sessions/test_recorded.py to replay.

    record.py --vllm-port P [--agents claude,codex,opencode,qwen] [--turns 8]
              [--answer-tokens 32] [--out-dir bench/sessions/recorded]

Each agent holds one conversation of TURNS prompts in one working directory: the first run
starts it, every later one continues it with the agent's own mechanism (`claude -p
--continue`, `codex exec resume --last`, `opencode run --continue`, `qwen --continue`). Every
request it sends passes a recording pass-through (tests/sessions/clis.Tap) on its way to vLLM:
method, path, the headers below (the API keys never), and the body's bytes exactly as sent.
The tiny model with random weights never ends an answer itself, so the pass-through ends it
for the agent in what it forwards: stop strings (STOP: Anthropic `stop_sequences`, chat
`stop`; the answer ends normally after a few tokens, as a real model's answer ends) and the cap
lowered to ANSWER_TOKENS (`max_tokens`, `max_completion_tokens` or `max_output_tokens`; added
where the agent sends none; Responses takes no stop strings, so Codex's answers end there, as
`incomplete`). The conversation grows by a few dozen tokens a turn; the recorded bodies are
the agent's own, cap included. vLLM must serve the model as `qwen3-tiny` with a window of at
least the agents' prompts (tests/sessions: 12288).

A vLLM for it, as the recordings in the repository were made (about three minutes for the four
agents once it runs):

    INCONTEXT_VLLM_STATE=/tmp/v INCONTEXT_VLLM_MAX_MODEL_LEN=12288 scripts/vllm.sh start 18000
    .venv/bin/python bench/sessions/record.py --vllm-port 18000

Output: OUT_DIR/<agent>.jsonl.gz, one JSON object per request, in order:
  {"agent", "turn" (1-based run of the agent), "seq", "method", "path", "headers",
   "body" (the body's bytes as UTF-8 text: encoding it gives the recorded bytes back),
   "status" (vLLM's answer to the forwarded request)}
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.sessions import clis  # noqa: E402

AGENTS = ("claude", "codex", "opencode", "qwen")
NAMES = {"claude": "Claude Code", "codex": "Codex CLI", "opencode": "OpenCode",
         "qwen": "Qwen Code"}
# Headers kept: what tells a conversation and its client apart, never a credential.
KEEP = ("content-type", "user-agent", "anthropic-version", "anthropic-beta",
        "x-claude-code-session-id", "session-id", "session_id", "x-session-id",
        "x-session-affinity", "originator", "openai-beta", "x-stainless-lang",
        "x-stainless-package-version", "x-stainless-retry-count", "conversation_id",
        "x-client-request-id", "x-codex-turn-metadata")
PROMPTS = (
    "List the files in this directory and tell me what this project is.",
    "Read main.py and explain what the function add does.",
    "Add a function sub(a, b) to main.py that subtracts b from a.",
    "Now write a test for sub in test_main.py.",
    "Run the tests with python -m pytest and report the result.",
    "Summarise what you changed in this conversation.",
    "Also add a docstring to add.",
    "Thanks. Anything else worth fixing in main.py?",
)
# A tiny project for the agents to look at.
PROJECT = {
    "main.py": "def add(a, b):\n    return a + b\n\n\nif __name__ == \"__main__\":\n"
               "    print(add(2, 3))\n",
    "README.md": "# calc\n\nA tiny calculator used to try coding agents.\n",
}
STOP = ["e ", "s ", "t ", "n "]
CAPS = {"/v1/messages": "max_tokens", "/v1/chat/completions": "max_tokens",
        "/v1/responses": "max_output_tokens"}


def lower_cap(answer_tokens):
    """The forward transform: the body with its cap at most `answer_tokens`."""
    def forward(path, raw):
        route = path.split("?", 1)[0]
        field = next((f for p, f in CAPS.items() if route.endswith(p)), None)
        if field is None or not raw:
            return raw
        try:
            body = json.loads(raw)
        except ValueError:
            return raw
        if not isinstance(body, dict):
            return raw
        for name in (field, "max_completion_tokens"):
            if isinstance(body.get(name), int):
                body[name] = min(body[name], answer_tokens)
        if not any(isinstance(body.get(n), int) for n in (field, "max_completion_tokens")):
            body[field] = answer_tokens
        if route.endswith("/v1/messages"):
            body["stop_sequences"] = STOP
        elif route.endswith("/v1/chat/completions"):
            body["stop"] = STOP
        return json.dumps(body).encode()
    return forward


def run_claude(url, workdir, home, prompt, turn):
    env = clis.environment(clis.CLAUDE_ENV, url, home)
    args = [clis.CLAUDE, "-p", prompt, "--output-format", "json", "--model", clis.MODEL,
            "--max-turns", "4", "--permission-mode", "acceptEdits"]
    if turn > 1:
        args.append("--continue")
    return clis.run(args, workdir, env)


def run_codex(url, workdir, home, prompt, turn):
    (home / "config.toml").write_text(clis.at(clis.CODEX_TOML, url))
    env = clis.environment(clis.CODEX_ENV, url, home, CODEX_HOME=str(home))
    if turn == 1:
        args = [clis.CODEX, "exec", "--json", "--skip-git-repo-check", prompt]
    else:
        args = [clis.CODEX, "exec", "resume", "--last", "--json", "--skip-git-repo-check",
                prompt]
    return clis.run(args, workdir, env)


def run_opencode(url, workdir, home, prompt, turn):
    (workdir / "opencode.json").write_text(clis.at(clis.OPENCODE_JSON, url))
    env = clis.environment(clis.OPENCODE_ENV, url, home)
    args = [clis.OPENCODE, "run", "--format", "json", "--title", "incontext"]
    if turn > 1:
        args.append("--continue")
    return clis.run(args + [prompt], workdir, env)


def run_qwen(url, workdir, home, prompt, turn):
    (home / ".qwen").mkdir(exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(clis.QWEN_SETTINGS)
    env = clis.environment(clis.QWEN_ENV, url, home)
    args = [clis.QWEN, prompt, "--output-format", "json", "--exclude-tools", "agent"]
    if turn > 1:
        args.append("--continue")
    return clis.run(args, workdir, env)


RUNS = {"claude": run_claude, "codex": run_codex, "opencode": run_opencode, "qwen": run_qwen}


def record(agent, vllm_url, turns, answer_tokens, work):
    """The requests of one conversation of `turns` runs of `agent`, as record lines."""
    # HOME beside the project, not in it: an agent that lists its working directory would
    # otherwise see its own session files change from run to run.
    shutil.rmtree(work / agent, ignore_errors=True)
    workdir = work / agent / "calc"
    workdir.mkdir(parents=True)
    for name, text in PROJECT.items():
        (workdir / name).write_text(text)
    home = clis.fresh(work / agent)
    lines = []
    with clis.Tap(vllm_url, forward=lower_cap(answer_tokens)) as tap:
        for turn in range(1, turns + 1):
            before = len(tap.sent)
            out = RUNS[agent](tap.url, workdir, home, PROMPTS[turn - 1], turn)
            new = tap.sent[before:]
            print(f"record: {agent} turn {turn}: exit {out.returncode}, {len(new)} requests "
                  f"{[(s.path, s.status) for s in new]}", file=sys.stderr, flush=True)
            if out.returncode != 0:
                print(f"record: {agent} stderr: {out.stderr[-600:]}", file=sys.stderr)
            for s in new:
                text = s.raw.decode("utf-8")
                assert text.encode("utf-8") == s.raw
                lines.append({"agent": agent, "turn": turn, "seq": len(lines), "method":
                              s.method, "path": s.path,
                              "headers": {k: v for k, v in s.headers.items() if k in KEEP},
                              "body": text, "status": s.status})
    return lines


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                compresslevel=9) as f:
        for line in lines:
            f.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))


def load(path):
    """The record lines of one agent's file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-port", type=int, required=True)
    ap.add_argument("--agents", default=",".join(AGENTS))
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "sessions" / "recorded"))
    args = ap.parse_args()
    if args.turns > len(PROMPTS):
        raise SystemExit(f"--turns: at most {len(PROMPTS)}")
    for agent in args.agents.split(","):
        binary = {"claude": clis.CLAUDE, "codex": clis.CODEX, "opencode": clis.OPENCODE,
                  "qwen": clis.QWEN}[agent]
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run scripts/setup-sessions.sh")
    out = Path(args.out_dir)
    with tempfile.TemporaryDirectory(prefix="incontext-record.") as tmp:
        for agent in args.agents.split(","):
            lines = record(agent, f"http://127.0.0.1:{args.vllm_port}", args.turns,
                           args.answer_tokens, Path(tmp))
            write(out / f"{agent}.jsonl.gz", lines)
            print(f"record: {agent}: {len(lines)} requests -> {out / (agent + '.jsonl.gz')} "
                  f"({os.path.getsize(out / (agent + '.jsonl.gz'))} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
