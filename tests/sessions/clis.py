"""The real agents of the session suite — Claude Code, Codex CLI, OpenCode and Qwen Code,
installed pinned from npm by scripts/setup-sessions.sh — and how each is pointed at Envoy.

Each agent runs with HOME (and its own configuration directory) in a fresh directory under the
test's tmp_path and with the configuration docs/agents.md shows: the texts below, with the
doc's address replaced by the test's (test_agents.py checks that the doc holds them verbatim).
Every one reaches loopback only: telemetry, update checks, plugin and model-catalogue
downloads are off (checked with strace while writing them: no connect beyond 127.0.0.1).

``Tap`` records what an agent sends (method, path, headers, JSON body) on its way to a server,
forwarding every byte of the request and of the answer unchanged.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import httpx

from tests.clients.stack import MODEL

AGENTS_DIR = Path(os.environ.get("INCONTEXT_AGENTS_DIR",
                                 Path.home() / ".cache" / "incontext" / "agents"))
BIN = AGENTS_DIR / "node_modules" / ".bin"
CLAUDE, CODEX, OPENCODE, QWEN = (BIN / n for n in ("claude", "codex", "opencode", "qwen"))
PROMPT = "Say hello."
DOC_ENVOY = "http://127.0.0.1:10000"    # the address the doc's snippets show (Envoy's listener)

# --- the configurations (docs/agents.md shows these texts) ---------------------------------
CLAUDE_ENV = f"""\
export ANTHROPIC_BASE_URL={DOC_ENVOY}
export ANTHROPIC_API_KEY=x
export ANTHROPIC_MODEL={MODEL}
export ANTHROPIC_SMALL_FAST_MODEL={MODEL}
export ANTHROPIC_DEFAULT_HAIKU_MODEL={MODEL}
export ANTHROPIC_DEFAULT_SONNET_MODEL={MODEL}
export ANTHROPIC_DEFAULT_OPUS_MODEL={MODEL}
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
export DISABLE_TELEMETRY=1
export DISABLE_AUTOUPDATER=1
export DISABLE_ERROR_REPORTING=1
"""

CODEX_TOML = f"""\
model = "{MODEL}"
model_provider = "incontext"
check_for_update_on_startup = false

[model_providers.incontext]
name = "incontext"
base_url = "{DOC_ENVOY}/v1"
wire_api = "responses"
env_key = "INCONTEXT_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[features]
plugins = false

[analytics]
enabled = false
"""

# Codex's compaction settings (docs/agents.md): model_context_window = W, the window incontext
# enforces (the suite's vLLM's); model_auto_compact_token_limit = W − R − G (R 1920, G 160 the
# most one turn adds before its first request; test_codex_compaction.py).
CODEX_COMPACTION = """\
model_context_window = 12288
model_auto_compact_token_limit = 10208
"""

CODEX_ENV = """\
export INCONTEXT_API_KEY=x
"""

OPENCODE_JSON = f"""\
{{
  "autoupdate": false,
  "share": "disabled",
  "model": "incontext/{MODEL}",
  "small_model": "incontext/{MODEL}",
  "provider": {{
    "incontext": {{
      "npm": "@ai-sdk/openai-compatible",
      "name": "incontext",
      "options": {{"baseURL": "{DOC_ENVOY}/v1", "apiKey": "x"}},
      "models": {{"{MODEL}": {{"name": "{MODEL}"}}}}
    }}
  }}
}}
"""

OPENCODE_ENV = """\
export OPENCODE_DISABLE_MODELS_FETCH=1
export npm_config_offline=true
"""

QWEN_SETTINGS = """\
{
  "security": {"auth": {"selectedType": "openai"}},
  "general": {"enableAutoUpdate": false},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "memory": {"enableManagedAutoMemory": false}
}
"""

QWEN_ENV = f"""\
export OPENAI_BASE_URL={DOC_ENVOY}/v1
export OPENAI_API_KEY=x
export OPENAI_MODEL={MODEL}
"""

# docs/agents.md: each text follows a line `<!-- tests/sessions: NAME -->`.
SNIPPETS = {
    "claude-code.env": CLAUDE_ENV,
    "codex.config.toml": CODEX_TOML,
    "codex.env": CODEX_ENV,
    "codex.compaction.toml": CODEX_COMPACTION,
    "opencode.json": OPENCODE_JSON,
    "opencode.env": OPENCODE_ENV,
    "qwen-code.settings.json": QWEN_SETTINGS,
    "qwen-code.env": QWEN_ENV,
}


def at(text: str, base_url: str) -> str:
    """A snippet with the doc's address replaced by ``base_url``."""
    return text.replace(DOC_ENVOY, base_url)


def environment(snippet: str, base_url: str, home: Path, **extra) -> Dict[str, str]:
    """The process environment of an agent: PATH, HOME and the snippet's `export` lines."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    for line in at(snippet, base_url).splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    env.update(extra)
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run(args: List[str], workdir: Path, env: Dict[str, str]) -> Run:
    out = subprocess.run([str(a) for a in args], cwd=workdir, env=env, capture_output=True,
                         text=True, timeout=300, stdin=subprocess.DEVNULL)
    return Run(out.returncode, out.stdout, out.stderr)


def json_lines(text: str) -> List[dict]:
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]


def fresh(workdir: Path) -> Path:
    """A new HOME under ``workdir`` (the agent's working directory)."""
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    return home


# --- the runs -----------------------------------------------------------------------------
def claude(base_url: str, workdir: Path, prompt=PROMPT) -> dict:
    """`claude -p … --output-format json`: its final result object."""
    env = environment(CLAUDE_ENV, base_url, fresh(workdir))
    out = run([CLAUDE, "-p", prompt, "--output-format", "json", "--model", MODEL,
               "--max-turns", "1"], workdir, env)
    lines = json_lines(out.stdout)
    assert lines, f"claude printed no JSON (exit {out.returncode}): {out.stdout[-500:]} " \
                  f"{out.stderr[-500:]}"
    return lines[-1]


def codex(base_url: str, workdir: Path, prompt=PROMPT, *, resume=False,
          settings="") -> List[dict]:
    """`codex exec --json` with ``settings`` (top-level keys) + CODEX_TOML as
    $CODEX_HOME/config.toml: its events. ``resume``: `codex exec resume --last`, which continues
    Codex's most recent conversation in ``workdir``."""
    home = fresh(workdir)
    (home / "config.toml").write_text(settings + at(CODEX_TOML, base_url))
    env = environment(CODEX_ENV, base_url, home, CODEX_HOME=str(home))
    command = [CODEX, "exec", *(["resume", "--last"] if resume else []), "--json",
               "--skip-git-repo-check", prompt]
    out = run(command, workdir, env)
    events = json_lines(out.stdout)
    assert events, f"codex printed no events (exit {out.returncode}): {out.stderr[-500:]}"
    return events


@dataclass
class OpenCodeRun:
    events: List[dict]      # `--format json` events
    log: str                # its log (--print-logs): one `message=stream … agent=NAME` per call

    def errors(self) -> List[dict]:
        return [e["error"] for e in self.events if e.get("type") == "error"]

    def calls(self) -> List[str]:
        """The agent (build, compaction, title, …) of each model call, in order."""
        return [field.split("=", 1)[1] for line in self.log.splitlines()
                if 'message=stream ' in line for field in line.split() if
                field.startswith("agent=")]


def opencode(base_url: str, workdir: Path, prompt=PROMPT) -> OpenCodeRun:
    """`opencode run --format json` with OPENCODE_JSON as the project's opencode.json. A
    title of its own (`--title`) spares the session-title call, so the only calls are the
    agent's and its compaction's."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "opencode.json").write_text(at(OPENCODE_JSON, base_url))
    env = environment(OPENCODE_ENV, base_url, fresh(workdir))
    out = run([OPENCODE, "run", "--format", "json", "--title", "incontext", "--print-logs",
               prompt], workdir, env)
    events = json_lines(out.stdout)
    assert events, f"opencode printed no events (exit {out.returncode}): {out.stderr[-800:]}"
    return OpenCodeRun(events, out.stderr)


@dataclass
class QwenRun:
    messages: List[dict]    # `--output-format json`: the session's messages, the result last
    debug: str              # its debug log ($HOME/.qwen/debug/<session>.txt)

    @property
    def result(self) -> dict:
        return self.messages[-1]


def qwen(base_url: str, workdir: Path, prompt=PROMPT) -> QwenRun:
    """`qwen PROMPT --output-format json` with QWEN_SETTINGS as ~/.qwen/settings.json and its
    debug log on (QWEN_DEBUG_LOG_FILE). `--exclude-tools agent` leaves out its sub-agent tool
    (~3.3k tokens of schema), so its prompt (~8.9k tokens) fits the suite's 12288-token window
    with room to answer."""
    home = fresh(workdir)
    (home / ".qwen").mkdir(exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(QWEN_SETTINGS)
    env = environment(QWEN_ENV, base_url, home, QWEN_DEBUG_LOG_FILE="1")
    out = run([QWEN, prompt, "--output-format", "json", "--exclude-tools", "agent"], workdir,
              env)
    start = out.stdout.find("[")
    assert start >= 0, f"qwen printed no JSON (exit {out.returncode}): {out.stderr[-800:]}"
    messages = json.loads(out.stdout[start:])
    logs = sorted((home / ".qwen" / "debug").glob("*.txt"))
    assert len(logs) == 1, f"expected one debug log, found {logs}"
    return QwenRun(messages, logs[0].read_text(errors="replace"))


# --- what an agent sends ------------------------------------------------------------------
@dataclass
class Sent:
    method: str
    path: str
    headers: Dict[str, str]     # lower-case names
    body: Optional[dict]
    status: Optional[int] = None                    # the answer's
    answer_headers: Optional[Dict[str, str]] = None     # lower-case names
    raw: bytes = b""                                # the body's bytes as the agent sent them
    answer: bytes = b""                             # the answer's body as the agent got it


_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


class Tap:
    """A pass-through on a loopback port in front of ``target`` (an http:// base address):
    records each request and forwards it and the answer byte for byte (the answer streamed
    as it comes, the connection closed after it). ``forward(path, raw)``, when given, is the
    body sent on in place of the recorded one (bench/sessions/record.py lowers the cap)."""

    def __init__(self, target: str, forward=None):
        self.target = target.rstrip("/")
        self.sent: List[Sent] = []
        tap = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                sent = Sent(self.command, self.path,
                            {k.lower(): v for k, v in self.headers.items()}, body, raw=raw)
                tap.sent.append(sent)
                if forward is not None:
                    raw = forward(self.path, raw)
                upstream = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                with httpx.Client(timeout=300) as client, client.stream(
                        self.command, tap.target + self.path, headers=upstream,
                        content=raw) as answer:
                    sent.status = answer.status_code
                    sent.answer_headers = {k.lower(): v for k, v in answer.headers.items()}
                    self.send_response_only(answer.status_code)
                    for k, v in answer.headers.multi_items():
                        if k.lower() not in _HOP:
                            self.send_header(k, v)
                    self.send_header("connection", "close")
                    self.end_headers()
                    got = []
                    for chunk in answer.iter_raw():
                        got.append(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    sent.answer = b"".join(got)
                self.close_connection = True

            do_GET = do_POST = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="tap")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Tap":
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def calls(self, path_end: str) -> List[Sent]:
        """The requests whose path (without query) ends in ``path_end``."""
        return [s for s in self.sent if s.path.split("?", 1)[0].endswith(path_end)]
