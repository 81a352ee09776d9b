"""The real llama.cpp `llama-server` (scripts/llamacpp.sh) and Envoy + incontext in front of it,
for tests/llamacpp.

llama-server is built from the llama.cpp sources vendored in PyPI's llama-cpp-python sdist by
scripts/setup-llamacpp.sh and serves the tiny Qwen3 model as GGUF (`qwen3-tiny`, real Qwen3
tokenizer and chat template, random weights) in one 512-token slot. Envoy is rendered from
envoy/envoy.yaml by tests/harness/envoy.py; its `vllm` cluster (the model server) points at
llama-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import httpx

from tests.harness.envoy import (MODULE, WASM, Envoy, envoy_binary, free_port,  # noqa: F401
                                 no_filter)
from tests.harness.servers import StackError  # noqa: F401 (re-exported)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

LLAMACPP_SH = ROOT / "scripts" / "llamacpp.sh"
MODEL = "qwen3-tiny"        # served model alias (scripts/llamacpp.sh)
R = 64                      # min_output_tokens of the test configuration
F = 32                      # fallback_margin_tokens of the test configuration




class LlamaServer:
    """One llama-server started with scripts/llamacpp.sh, with its own state directory (pid,
    port and log files), so it never clashes with a demo instance under .cache/."""

    def __init__(self, state_dir: Path, port: Optional[int] = None, ctx: Optional[int] = None,
                 args: tuple = ()):
        """``ctx``: its --ctx-size (scripts/llamacpp.sh's default else); ``args``: more
        llama-server arguments (after the script's own, so they win)."""
        self.ctx = ctx
        self.args = tuple(args)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.start_seconds: Optional[float] = None
        self.http = httpx.Client(base_url=self.url, timeout=60.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "llamacpp.log"

    def _run(self, *args, timeout=300) -> subprocess.CompletedProcess:
        env = dict(os.environ, INCONTEXT_LLAMACPP_STATE=str(self.state_dir))
        if self.ctx is not None:
            env["INCONTEXT_LLAMACPP_CTX"] = str(self.ctx)
        return subprocess.run(["bash", str(LLAMACPP_SH), *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self):
        t0 = time.monotonic()
        try:
            out = self._run("start", str(self.port), *self.args)
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise StackError(f"scripts/llamacpp.sh start timed out after {e.timeout}s\n"
                             + self.log_tail()) from None
        if out.returncode != 0:
            raise StackError(
                f"scripts/llamacpp.sh start {self.port} failed (exit {out.returncode}); run "
                f"scripts/setup-llamacpp.sh first?\n{out.stdout}\n{out.stderr}\n"
                f"{self.log_tail()}")
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self):
        self.http.close()
        try:
            self._run("stop", timeout=60)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, n=40) -> str:
        if not self.log_path.exists():
            return "(no llama-server log)"
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "----- llama-server log tail -----\n" + "\n".join(lines[-n:])

    # direct calls, bypassing Envoy --------------------------------------------------------
    def post(self, path: str, body: dict) -> httpx.Response:
        return self.http.post(path, json=body)

    def post_ok(self, path: str, body: dict) -> dict:
        r = self.post(path, body)
        if r.status_code != 200:
            raise AssertionError(f"POST {path} answered {r.status_code}: {r.text[:400]}")
        return r.json()

    def props(self) -> dict:
        r = self.http.get("/props")
        if r.status_code != 200:
            raise AssertionError(f"GET /props answered {r.status_code}: {r.text[:400]}")
        return r.json()

    def n_ctx(self) -> int:
        """The per-slot window llama-server reports: /props default_generation_settings.n_ctx."""
        return self.props()["default_generation_settings"]["n_ctx"]

    def chat_input_tokens(self, body: dict) -> int:
        return self.post_ok("/v1/chat/completions/input_tokens", body)["input_tokens"]

    def anthropic_count(self, body: dict) -> int:
        return self.post_ok("/v1/messages/count_tokens", body)["input_tokens"]

    def tokenize(self, content: str, **extra) -> List[int]:
        return self.post_ok("/tokenize", {"content": content, **extra})["tokens"]


def anthropic_prompt_tokens(usage: dict) -> int:
    """The whole prompt of an Anthropic `usage`: llama-server reports the part it found in the
    slot's prompt cache as `cache_read_input_tokens` and only the rest as `input_tokens`."""
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)


# --- Envoy ---------------------------------------------------------------------------------
def plugin_config(server_port: int) -> dict:
    """The llamacpp backend configuration: no context_length, the filter learns C from
    GET /props."""
    return {
        "tokenizer": {"backend": "llamacpp", "cluster": "vllm",
                      "authority": f"127.0.0.1:{server_port}"},
        "min_output_tokens": R,
        "fallback_margin_tokens": F,
    }


def start_envoy(workdir: Path, name: str, upstream_port: int, config: dict,
                glue: str = "wasm") -> Envoy:
    """``glue``: the build, "wasm" or "module" (the native dynamic module)."""
    binary = envoy_binary()
    if not binary:
        raise StackError("Envoy binary not found: run scripts/setup.sh (or set ENVOY_BIN)")
    artifact = {"wasm": WASM, "module": MODULE}[glue]
    if not artifact.is_file() and not no_filter():
        raise StackError(f"{artifact} is missing: run scripts/build-{glue}.sh")
    env = Envoy(binary, workdir, config, ("127.0.0.1", upstream_port),
                remove_filter=no_filter(), name=name, glue=glue)
    return env.start()


class Reply:
    def __init__(self, resp: httpx.Response, delta: Dict[str, int]):
        self.resp = resp
        self.delta = delta

    @property
    def status(self) -> int:
        return self.resp.status_code

    def h(self, name: str) -> Optional[str]:
        return self.resp.headers.get(name)

    def int_header(self, name: str) -> Optional[int]:
        v = self.h(name)
        return int(v) if v is not None else None

    def json(self):
        return self.resp.json()

    def describe(self) -> str:
        hs = {k: v for k, v in self.resp.headers.items() if k.startswith("x-incontext")}
        return f"HTTP {self.status} {hs} counters={self.delta} body={self.resp.text[:300]!r}"


class Client:
    """Sends requests through one Envoy and reports the incontext counter deltas."""

    def __init__(self, envoy: Envoy):
        self.envoy = envoy
        self.http = httpx.Client(base_url=envoy.url, timeout=60.0)

    def close(self):
        self.http.close()

    def post(self, path: str, body: dict) -> Reply:
        raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
        before = self.envoy.counters()
        resp = self.http.post(path, content=raw, headers={"content-type": "application/json"})
        after = self.envoy.counters()
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        return Reply(resp, delta)
