"""SGLang servers and Envoy + incontext in front of them, for tests/sglang.

* ``Sglang``: the real SGLang 0.5.23 (scripts/sglang.sh: CPU, tiny Qwen3 with the real Qwen3
  tokenizer and chat template, dummy weights, context length 512), or an SGLang already
  running elsewhere when INCONTEXT_SGLANG_URL is set (e.g. on a GPU machine).
* ``FakeSglang``: tests/sglang/fake_sglang.py, the fault-injection stub (real tokenizer; run
  with the vLLM virtualenv's python).
* Envoy is rendered from envoy/envoy.yaml by tests/harness/envoy.py, the `vllm` cluster
  pointed at the server under test, with the `sglang` backend's plugin configuration.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import List, Optional
from urllib.parse import urlsplit

import httpx

from tests.harness.envoy import WASM, Envoy, envoy_binary, free_port  # noqa: F401
from tests.harness.servers import StackError  # noqa: F401 (re-exported)
from tests.vllm.stack import Client, Reply  # noqa: F401

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

SGLANG_SH = ROOT / "scripts" / "sglang.sh"
FAKE = HERE / "fake_sglang.py"
MODEL = "qwen3-tiny"   # served model name (scripts/sglang.sh)
R = 64                 # min_output_tokens of the test configuration
F = 32                 # fallback_margin_tokens of the test configuration
FILLER = " a"          # one Qwen3 token per repetition
# (server, shape, filter count, server's usage count): printed after the run
COUNT_LOG: List[tuple] = []




def vllm_venv() -> Path:
    return Path(os.environ.get("INCONTEXT_VLLM_VENV") or ROOT / ".venv-vllm")


def model_dir() -> Path:
    return Path(os.environ.get("INCONTEXT_VLLM_MODEL") or ROOT / ".cache" / "model" / "qwen3-tiny")


class Server:
    """What the tests need of any SGLang-shaped server (real or stub)."""

    host = "127.0.0.1"
    port = 0
    model = MODEL

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def post(self, path: str, body: dict, timeout=300.0) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=timeout)

    def window(self) -> int:
        """The server's own context length: `GET /v1/models` `data[0].max_model_len`."""
        r = self.get("/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["max_model_len"]

    def tokenizer_limit(self) -> int:
        """`/tokenize`'s `max_model_len` (the tokenizer's limit)."""
        r = self.post("/tokenize", {"model": self.model, "prompt": "x"})
        r.raise_for_status()
        return r.json()["max_model_len"]

    def count_chat(self, body: dict) -> int:
        keep = ("messages", "tools", "tool_choice", "reasoning_effort", "chat_template_kwargs")
        payload = {"model": self.model, **{k: body[k] for k in keep if k in body}}
        r = self.post("/tokenize", payload)
        if r.status_code != 200:
            raise StackError(f"/tokenize answered {r.status_code}: {r.text[:300]}")
        return r.json()["count"]

    def count_prompt(self, prompt: str) -> int:
        r = self.post("/tokenize", {"model": self.model, "prompt": prompt})
        r.raise_for_status()
        return r.json()["count"]

    def count_anthropic(self, body: dict) -> int:
        payload = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        r = self.post("/v1/messages/count_tokens", payload)
        r.raise_for_status()
        return r.json()["input_tokens"]


class Sglang(Server):
    """The real SGLang: started with scripts/sglang.sh in its own state directory, or the
    server at INCONTEXT_SGLANG_URL (left alone)."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.external = os.environ.get("INCONTEXT_SGLANG_URL")
        self.start_seconds: Optional[float] = None
        if self.external:
            u = urlsplit(self.external)
            self.host, self.port = u.hostname, u.port or 80
            self.model = os.environ.get("INCONTEXT_SGLANG_MODEL") or self._served_name()
        else:
            self.port = free_port()

    def _served_name(self) -> str:
        try:
            return httpx.get(self.external.rstrip("/") + "/v1/models",
                             timeout=10).json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            raise StackError(f"INCONTEXT_SGLANG_URL={self.external}: GET /v1/models "
                             f"failed: {e}") from None

    @property
    def log_path(self) -> Path:
        return self.state_dir / "sglang.log"

    def _run(self, *args, timeout=600) -> subprocess.CompletedProcess:
        env = dict(os.environ, INCONTEXT_SGLANG_STATE=str(self.state_dir))
        return subprocess.run(["bash", str(SGLANG_SH), *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self):
        if self.external:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            out = self._run("start", str(self.port))
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise StackError(f"scripts/sglang.sh start timed out after {e.timeout}s\n"
                             + self.log_tail()) from None
        if out.returncode != 0:
            raise StackError(
                f"scripts/sglang.sh start {self.port} failed (exit {out.returncode}); run "
                f"scripts/setup-sglang.sh first?\n{out.stdout}\n{out.stderr}\n{self.log_tail()}")
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self):
        if self.external:
            return
        try:
            self._run("stop", timeout=120)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, n=40) -> str:
        if not self.log_path.exists():
            return "(no SGLang log)"
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "----- SGLang log tail -----\n" + "\n".join(lines[-n:])


class FakeSglang(Server):
    """tests/sglang/fake_sglang.py on a free port, run with the vLLM virtualenv's python."""

    def __init__(self, workdir: Path, context_length: int = 512):
        self.port = free_port()
        self.context_length = context_length
        self.log_path = Path(workdir) / "fake_sglang.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout=180.0):
        py = vllm_venv() / "bin" / "python"
        if not py.exists():
            raise StackError(f"{py} is missing: run scripts/setup-vllm.sh (the stub needs "
                             "its transformers)")
        if not (model_dir() / "tokenizer.json").exists():
            raise StackError(f"no tokenizer in {model_dir()}: run scripts/setup-vllm.sh")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(py), str(FAKE), "--port", str(self.port), "--model-dir", str(model_dir()),
             "--served-model-name", MODEL, "--context-length", str(self.context_length)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                     TOKENIZERS_PARALLELISM="false"))
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StackError(f"fake_sglang.py exited with {self.proc.returncode}:\n"
                                 + self.log_path.read_text(errors="replace")[-2000:])
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise StackError("fake_sglang.py did not answer /health in time")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def set_fault(self, fault: str):
        r = httpx.post(self.url + "/_stub/fault", json={"fault": fault}, timeout=10)
        r.raise_for_status()

    def calls(self) -> dict:
        return httpx.get(self.url + "/_stub/calls", timeout=10).json()


# --- Envoy ---------------------------------------------------------------------------------
def plugin_config(server: Server, **changes) -> dict:
    """The `sglang` backend: counts with SGLang's /tokenize and /v1/messages/count_tokens,
    window learned from GET /v1/models (no context_length)."""
    cfg = {
        "tokenizer": {"backend": "sglang", "cluster": "vllm",
                      "authority": server.authority, "timeout_ms": 10000},
        "min_output_tokens": R,
        "fallback_margin_tokens": F,
    }
    cfg.update(changes)
    return cfg


def start_envoy(workdir: Path, name: str, server: Server, config: dict) -> Envoy:
    binary = envoy_binary()
    if not binary:
        raise StackError("Envoy binary not found: run scripts/setup.sh (or set ENVOY_BIN)")
    if not WASM.is_file():
        raise StackError(f"{WASM} is missing: run scripts/build-wasm.sh")
    return Envoy(binary, workdir, config, (server.host, server.port), name=name).start()


# --- prompt sizing -------------------------------------------------------------------------
def fit(count, build, target: int):
    """A body whose prompt is exactly ``target`` tokens by the server's own count:
    ``build(filler)`` makes the body, ``count(body)`` counts it."""
    base = count(build(""))
    if base > target:
        raise StackError(f"the prompt without filler has {base} tokens > {target}")
    n = target - base
    got = None
    for _ in range(8):
        body = build(FILLER * n)
        got = count(body)
        if got == target:
            return body
        n += target - got
        if n < 0:
            break
    raise StackError(f"could not size a prompt to {target} tokens (last {got})")
