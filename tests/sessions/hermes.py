"""Hermes Agent (PyPI `hermes-agent`, pinned by scripts/setup-hermes.sh with the seed plugin
`incontext` in its own virtualenv) and how it is pointed at Envoy, at vLLM, or at vLLM with the
seed plugin in its own process.

Every run has a fresh HOME (Hermes keeps its configuration, sessions and logs in
$HOME/.hermes) and reaches loopback only (checked with strace while writing this): lazy
package installs are off (`HERMES_DISABLE_LAZY_INSTALLS=1`, `security.allow_lazy_installs:
false`), so is the tirith pre-exec scanner, which Hermes would otherwise download, and its
start-up update check (PyPI) finds a recent answer of its own.

A conversation is `hermes chat -Q -q MESSAGE` for its first turn and the same with `--continue`
(the latest session of that HOME) for each later one. Hermes answers a reply cut by its cap
(`finish_reason` `length`) by asking the model to continue, three times, each time with twice
the cap: a turn against the random-weight model (which never ends an answer itself) is four
main requests with caps B, 2B, 4B, 8B.

``Probe`` stands in for the model server for one request: it records what Hermes sends and
answers 401, so the test can count that request with vLLM's /tokenize before sending the real
turn (a turn whose prompt must sit exactly at the edge).
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from tests.clients.stack import MODEL
from tests.sessions.clis import DOC_ENVOY, Sent, at

VENV = Path(os.environ.get("INCONTEXT_HERMES_VENV",
                           Path.home() / ".cache" / "incontext" / "venv-hermes"))
HERMES = VENV / "bin" / "hermes"
HERMES_VERSION = "0.19.0"
SEED_VERSION = "0.0.5"          # the seed plugin, PyPI `incontext`
WINDOW = 65536                  # Hermes' model.context_length (it refuses one under 64,000)
DOC_VLLM = "http://127.0.0.1:8000"      # the vLLM address the doc's seed snippet shows
SUMMARY = "You are a summarization agent creating a context checkpoint."

# --- the configurations (docs/agents.md shows these texts) ---------------------------------
HERMES_CONFIG = f"""\
model:
  default: {MODEL}
  provider: custom
  base_url: {DOC_ENVOY}/v1
  api_key: x
  context_length: {WINDOW}
security:
  tirith_enabled: false
  allow_lazy_installs: false
"""

HERMES_ENV = """\
export HERMES_DISABLE_LAZY_INSTALLS=1
"""

# Test-only, beside what docs/agents.md shows: Hermes' Python toolchain probe runs python3 and
# pip (3 s timeout each, 10 s in all) and adds a line to the system prompt when one fails; on a
# busy machine one times out, and two runs that must send the same prompts differ by it.
STABLE_PROMPT = {"agent": {"environment_probe": False}}

# The seed plugin: enabled in config.yaml, configured from the environment. It counts with the
# /tokenize of the vLLM that serves the model (whose max_model_len must equal
# model.context_length).
SEED_CONFIG = """\
plugins:
  enabled:
  - incontext
"""

SEED_ENV = f"""\
export INCONTEXT_TOKENIZER_URL={DOC_VLLM}/tokenize
export INCONTEXT_MIN_OUTPUT_TOKENS=4096
export INCONTEXT_FALLBACK_MARGIN_TOKENS=1024
"""


def seed_plugin_config(r: int, f: int, threshold: int) -> dict:
    """incontext's configuration that decides as the seed does for Hermes: its window is
    Hermes' compression threshold, the same R and F, reject mode (the seed compresses where
    incontext answers the window-full error Hermes compresses on)."""
    return {"window_tokens": threshold, "min_output_tokens": r,
            "fallback_margin_tokens": f, "on_insufficient": "reject"}


# docs/agents.md: each text follows a line `<!-- tests/sessions/hermes: NAME -->`.
SNIPPETS = {
    "hermes.config.yaml": HERMES_CONFIG,
    "hermes.env": HERMES_ENV,
    "hermes.seed.config.yaml": SEED_CONFIG,
    "hermes.seed.env": SEED_ENV,
    "hermes.incontext-as-seed.json": json.dumps(
        seed_plugin_config(4096, 1024, 64000), indent=2) + "\n",
}


def threshold(context_length: int, max_tokens: Optional[int]) -> int:
    """Hermes' compression threshold for a window under 512K at the default
    `compression.threshold` (agent/context_compressor.py): 75 % of the input budget, floored
    at 64,000 unless that floor reaches the budget."""
    budget = context_length - (max_tokens or 0)
    if budget <= 0:
        budget = context_length
    floored = max(int(budget * 0.75), 64000)
    if floored >= budget:
        return max(1, min(int(budget * 0.85), budget - 1))
    return floored


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else copy.deepcopy(v)
    return out


# --- runs ---------------------------------------------------------------------------------
@dataclass
class Turn:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class Hermes:
    """One Hermes installation in a fresh HOME under ``workdir`` (also its working directory,
    which its system prompt names: two conversations that must send the same prompts run in
    the same directory, one after the other, each with a HOME made afresh)."""

    def __init__(self, workdir: Path, base_url: str, *, extra: Optional[dict] = None,
                 seed: Optional[Dict[str, str]] = None):
        self.workdir = workdir
        self.home = workdir / "home"
        self.base_url = base_url
        self.extra = extra or {}
        self.seed = seed            # the seed plugin's INCONTEXT_* environment, or None

    @property
    def hermes_home(self) -> Path:
        return self.home / ".hermes"

    def config(self) -> dict:
        cfg = merge(yaml.safe_load(at(HERMES_CONFIG, self.base_url)), STABLE_PROMPT)
        if self.seed is not None:
            cfg = merge(cfg, yaml.safe_load(SEED_CONFIG))
        return merge(cfg, self.extra)

    def fresh(self) -> "Hermes":
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.hermes_home.mkdir(parents=True)
        # `hermes chat` asks PyPI at start whether it is up to date, unless it did within six
        # hours (banner.py): an answer of its own, "up to date", keeps it on loopback.
        (self.hermes_home / ".update_check").write_text(json.dumps(
            {"ts": time.time(), "behind": 0, "rev": None, "ver": HERMES_VERSION}))
        return self

    def write_config(self):
        self.hermes_home.mkdir(parents=True, exist_ok=True)
        (self.hermes_home / "config.yaml").write_text(yaml.safe_dump(self.config()))

    def environment(self) -> Dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        for line in HERMES_ENV.splitlines():
            k, _, v = line.removeprefix("export ").partition("=")
            env[k] = v
        if self.seed is not None:
            env.update(self.seed)
        return env

    def turn(self, message: str, *, first: bool, base_url: Optional[str] = None) -> Turn:
        """One turn of a conversation; ``base_url`` (a Tap's, say) from now on."""
        return self._run(["chat", "-Q", "-q", message] + ([] if first else ["--continue"]),
                         base_url)

    def oneshot(self, message: str, base_url: Optional[str] = None) -> Turn:
        """`hermes -z MESSAGE`: one turn, non-interactive, 16 tools (its exit code is 0 even
        when the answer is an error text)."""
        return self._run(["-z", message], base_url)

    def _run(self, argv: List[str], base_url: Optional[str]) -> Turn:
        if base_url is not None:
            self.base_url = base_url
        self.write_config()
        args = [str(HERMES), *argv]
        t0 = time.monotonic()
        out = subprocess.run(args, cwd=self.workdir, env=self.environment(),
                             capture_output=True, text=True, timeout=900,
                             stdin=subprocess.DEVNULL)
        return Turn(out.returncode, out.stdout, out.stderr, time.monotonic() - t0)

    def snapshot(self, to: Path):
        shutil.copytree(self.home, to, symlinks=True)

    def restore(self, snapshot: Path):
        shutil.rmtree(self.home)
        shutil.copytree(snapshot, self.home, symlinks=True)

    def log(self) -> str:
        """Hermes' own log (agent.log and errors.log)."""
        return "".join(p.read_text(errors="replace")
                       for p in sorted((self.hermes_home / "logs").glob("*.log")))


def seed_env(vllm_url: str, r: int, f: int) -> Dict[str, str]:
    """SEED_ENV with the test's vLLM, R and F."""
    env = {}
    for line in at(SEED_ENV, vllm_url).replace(DOC_VLLM, vllm_url).splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        env[k] = v
    env["INCONTEXT_MIN_OUTPUT_TOKENS"] = str(r)
    env["INCONTEXT_FALLBACK_MARGIN_TOKENS"] = str(f)
    # A count of a 64k-token prompt on a busy 2-core machine: the seed's 30 s default could
    # time out, and the seed would fall back to Hermes' rough estimate + F.
    env["INCONTEXT_TOKENIZER_TIMEOUT_SECONDS"] = "120"
    return env


# --- what Hermes sends ----------------------------------------------------------------------
def is_summary(s: Sent) -> bool:
    msgs = (s.body or {}).get("messages") or []
    return any(isinstance(m.get("content"), str) and m["content"].startswith(SUMMARY)
               for m in msgs if m.get("role") == "user")


def chat_calls(sent: List[Sent]) -> List[Sent]:
    return [s for s in sent if s.method == "POST"
            and s.path.split("?", 1)[0].endswith("/chat/completions")]


def main_calls(sent: List[Sent]) -> List[Sent]:
    """The agent's own requests (with its tools), not its summaries."""
    return [s for s in chat_calls(sent) if (s.body or {}).get("tools") and not is_summary(s)]


def incontext_of(s: Sent) -> Dict[str, str]:
    return {k: v for k, v in (s.answer_headers or {}).items() if k.startswith("x-incontext-")}


@dataclass
class Decision:
    """One main request: what reached the model server and how it ended."""
    prompt: int                 # vLLM's count of what was sent
    cap: Optional[int]          # the cap the model server got; None: it got no request
    status: int                 # the answer Hermes got
    action: str                 # the seed: rewritten / unchanged; incontext: x-incontext-action
    source: str                 # the seed: exact; incontext: x-incontext-source
    after_summary: bool         # a summary request came between this and the one before
    told: Optional[int] = None  # incontext: x-incontext-prompt-tokens (P, or P_hi from a bound)


class Probe:
    """A loopback server that records the first chat request Hermes sends and answers it
    401 (Hermes stops the turn); every other path gets 404."""

    def __init__(self):
        self.body: Optional[dict] = None
        probe = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                chat = self.command == "POST" and self.path.endswith("/chat/completions")
                if chat and probe.body is None:
                    probe.body = json.loads(raw)
                body = json.dumps({"error": {"message": "probe", "type": "auth"}}).encode()
                self.send_response(401 if chat else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Probe":
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

