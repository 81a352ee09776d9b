"""Fixtures for the real-vLLM suite.

* ``vllm``: one vLLM server for the whole run (scripts/vllm.sh on a free port, its own state
  directory), stopped at the end. If it cannot start, every test here FAILS (never skips).
* ``stack``: Envoy instances rendered from envoy/envoy.yaml with the `vllm` cluster pointed at
  that server, one per plugin configuration, started on first use and stopped at the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.vllm.stack import (COUNT_LOG, WASM, Client, StackError, Vllm, free_port, no_filter,
                              plugin_config, start_envoy)

HERE = Path(__file__).resolve().parent
_TIMINGS = {}


class Stack:
    """Envoys in front of the session's vLLM (or a dead port), one per named configuration."""

    def __init__(self, vllm: Vllm, workdir: Path):
        self.vllm = vllm
        self.workdir = workdir
        self.envoys = {}
        self.clients = []
        self.dead_port = free_port()   # nothing listens here

    def envoy(self, name: str, *, dead_upstream: bool = False, **changes):
        """The Envoy for configuration ``name`` (started once); ``changes`` amend the base
        plugin configuration (see tests.vllm.stack.plugin_config)."""
        env = self.envoys.get(name)
        if env is not None and env.alive():
            return env
        port = self.dead_port if dead_upstream else self.vllm.port
        cfg = plugin_config(self.vllm.port if not dead_upstream else port, **changes)
        try:
            env = start_envoy(self.workdir, f"envoy-{name}", port, cfg)
        except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the test
            pytest.fail(f"Envoy ({name}) could not be started: {e}", pytrace=False)
        self.envoys[name] = env
        return env

    def client(self, name: str, **kw) -> Client:
        c = Client(self.envoy(name, **kw))
        self.clients.append(c)
        return c

    def stop(self):
        for c in self.clients:
            c.close()
        for env in self.envoys.values():
            env.stop()


@pytest.fixture(scope="session")
def vllm(tmp_path_factory):
    # For iterating on the tests: INCONTEXT_VLLM_TEST_STATE + INCONTEXT_VLLM_TEST_PORT reuse a
    # server started with `INCONTEXT_VLLM_STATE=dir scripts/vllm.sh start port` (left running).
    state = os.environ.get("INCONTEXT_VLLM_TEST_STATE")
    port = os.environ.get("INCONTEXT_VLLM_TEST_PORT")
    if state and port:
        server = Vllm(Path(state), int(port))
        keep = server.healthy()
    else:
        server = Vllm(tmp_path_factory.mktemp("vllm-state"))
        keep = False
    t0 = time.monotonic()
    try:
        server.start()
    except (StackError, OSError) as e:
        server.stop()
        pytest.fail(f"vLLM could not be started: {e}", pytrace=False)
    _TIMINGS["vllm_start"] = time.monotonic() - t0
    _TIMINGS["suite_start"] = time.monotonic()
    yield server
    if not keep:
        server.stop()
    _TIMINGS["suite_end"] = time.monotonic()
    _TIMINGS["vllm_starts"] = list(server.start_seconds)


@pytest.fixture(scope="session")
def stack(vllm, tmp_path_factory):
    if not WASM.is_file() and not no_filter():
        pytest.fail(f"{WASM} is missing: run scripts/setup.sh", pytrace=False)
    s = Stack(vllm, tmp_path_factory.mktemp("vllm-envoy"))
    yield s
    s.stop()


@pytest.fixture
def exact(stack) -> Client:
    """Envoy + incontext with context_length 512, R 64, F 32, passthrough."""
    return stack.client("exact")


@pytest.fixture
def learned(stack) -> Client:
    """As ``exact`` but without context_length: C is learned from /tokenize."""
    return stack.client("learned", context_length=None)


@pytest.fixture
def reject(stack) -> Client:
    return stack.client("reject", on_insufficient="reject")


def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run. The first test also waits for vLLM to start."""
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "vllm_start" in _TIMINGS:
        line = f"incontext vllm: vLLM started in {_TIMINGS['vllm_start']:.0f} s"
        starts = _TIMINGS.get("vllm_starts", [])
        if len(starts) > 1:
            line += " (restarts: " + ", ".join(f"{s:.0f} s" for s in starts[1:]) + ")"
        if "suite_end" in _TIMINGS:
            line += (f"; tests with vLLM up took "
                     f"{_TIMINGS['suite_end'] - _TIMINGS['suite_start']:.0f} s")
        terminalreporter.write_line(line)
    if COUNT_LOG:
        ok = sum(1 for *_, ours, theirs in COUNT_LOG if ours == theirs)
        terminalreporter.write_line(
            f"incontext vllm: prompt counts compared with vLLM usage.prompt_tokens: "
            f"{ok} equal of {len(COUNT_LOG)}")
        for cfg, shape, ours, theirs in COUNT_LOG:
            mark = "equal" if ours == theirs else "DIFFERENT"
            terminalreporter.write_line(
                f"  {cfg:18} {shape:44} filter={ours} vllm={theirs} {mark}")
