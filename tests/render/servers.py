"""Model servers for the render and routes suites: vLLM (scripts/vllm.sh) with a chosen served
name and window, and vLLM's GPU-less render server (scripts/render.sh), each in its own state
directory on a free port."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Tuple

import httpx

from tests.harness.envoy import Envoy, envoy_binary, free_port
from tests.harness.servers import StackError
from tests.vllm.stack import ROOT, WASM, Vllm

RENDER_SH = ROOT / "scripts" / "render.sh"


class NamedVllm(Vllm):
    """A vLLM server serving ``name`` with window ``window``."""

    def __init__(self, state_dir: Path, name: str, window: int, extra_args: Tuple[str, ...] = ()):
        super().__init__(state_dir, extra_args=extra_args)
        self.name = name
        self.window = window

    def _env(self) -> dict:
        env = super()._env()
        env["INCONTEXT_VLLM_SERVED_NAME"] = self.name
        env["INCONTEXT_VLLM_MAX_MODEL_LEN"] = str(self.window)
        return env

    def handler_requests(self, handler: str) -> float:
        return self.http_requests(handler)


class RenderServer:
    """vLLM's render server (scripts/render.sh): counts, generates nothing."""

    def __init__(self, state_dir: Path, name: str, window: int):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.window = window
        self.port = free_port()
        self.start_seconds: List[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "render.log"

    def _run(self, *args, timeout=600) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env.update(INCONTEXT_RENDER_STATE=str(self.state_dir), INCONTEXT_VLLM_SERVED_NAME=self.name,
                   INCONTEXT_VLLM_MAX_MODEL_LEN=str(self.window))
        return subprocess.run(["bash", str(RENDER_SH), *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self):
        t0 = time.monotonic()
        try:
            out = self._run("start", str(self.port))
        except subprocess.TimeoutExpired as e:
            self.stop()
            raise StackError(f"scripts/render.sh start timed out after {e.timeout}s") from None
        if out.returncode != 0:
            raise StackError(f"scripts/render.sh start failed (exit {out.returncode}):\n"
                             f"{out.stdout}\n{out.stderr}\n{self.log_tail()}")
        self.start_seconds.append(time.monotonic() - t0)
        return self

    def stop(self):
        try:
            self._run("stop", timeout=120)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, n=40) -> str:
        if not self.log_path.exists():
            return "(no render server log)"
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "----- render server log tail -----\n" + "\n".join(lines[-n:])

    def http_requests(self, handler: str) -> float:
        import re
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            m = re.match(r'^http_requests_total\{(.*)\} ([0-9.e+]+)$', line)
            if m and f'handler="{handler}"' in m.group(1):
                total += float(m.group(2))
        return total


def cluster(name: str, port: int) -> dict:
    """A static cluster to 127.0.0.1:port."""
    return {
        "name": name, "connect_timeout": "5s", "type": "STATIC",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
    }


def start_envoy(workdir: Path, name: str, upstream_port: int, config: dict,
                extra_clusters=(), model_routes: Optional[List[Tuple[str, str]]] = None) -> Envoy:
    """Envoy + incontext in front of ``upstream_port`` (the `vllm` cluster), with
    ``extra_clusters``; ``model_routes`` [(model, cluster)] send a request whose `x-model`
    header names the model to that cluster (the way a gateway routes by the model it read)."""
    binary = envoy_binary()
    if not binary:
        raise StackError("Envoy binary not found: run scripts/setup.sh (or set ENVOY_BIN)")
    if not WASM.is_file():
        raise StackError(f"{WASM} is missing: run scripts/build-wasm.sh")
    env = Envoy(binary, workdir, config, ("127.0.0.1", upstream_port),
                extra_clusters=list(extra_clusters), name=name)
    if model_routes:
        import yaml
        hcm = env.cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]
        vhost = hcm["route_config"]["virtual_hosts"][0]
        template = vhost["routes"][-1]
        routes = []
        for model, cl in model_routes:
            r = {**template, "match": {"prefix": "/", "headers": [
                {"name": "x-model", "string_match": {"exact": model}}]},
                 "route": {**template["route"], "cluster": cl}}
            routes.append(r)
        vhost["routes"] = routes + vhost["routes"]
        env.config_path.write_text(yaml.safe_dump(env.cfg, sort_keys=False))
    return env.start()
