"""Fixtures for the agent-session suite: the real vLLM 0.32 (CPU, tiny Qwen3, a 12288-token
window — room for Claude Code's ~11.6k-token system prompt and tools — and `--enable-scale-out`
for the Responses render API) with Envoy + incontext in front, one Envoy per plugin
configuration (tests/vllm's base configuration with ``context_length`` WINDOW).

* ``vllm``: one server for the run (scripts/vllm.sh on a free port, its own state
  directory), stopped at the end; ``INCONTEXT_VLLM_TEST_STATE`` + ``INCONTEXT_VLLM_TEST_PORT`` reuse a
  running one started with `--enable-scale-out` (then left running). If it cannot start, every
  test FAILS.
* ``stack.envoy(name, **changes)``: started on first use.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import tests.clients.stack  # noqa: F401  (sets the LiteLLM offline switches before any import)
from tests.clients.stack import Stack, Vllm
from tests.harness.envoy import WASM, envoy_binary, no_filter
from tests.harness.servers import start_or_fail

HERE = Path(__file__).resolve().parent
SCALE_OUT = ("--enable-scale-out",)
WINDOW = 12288


class SessionVllm(Vllm):
    def _env(self):
        env = super()._env()
        env["INCONTEXT_VLLM_MAX_MODEL_LEN"] = str(WINDOW)
        return env
REPORTS = []        # session reports, printed after the run
_T = {}


@pytest.fixture(scope="package")
def vllm(tmp_path_factory):
    state = os.environ.get("INCONTEXT_VLLM_TEST_STATE")
    port = os.environ.get("INCONTEXT_VLLM_TEST_PORT")
    if state and port:
        server, keep = SessionVllm(Path(state), int(port)), True
    else:
        server = SessionVllm(tmp_path_factory.mktemp("vllm-state"), extra_args=SCALE_OUT)
        keep = False
    t0 = time.monotonic()
    start_or_fail(server, "vLLM", stop_on_failure=not keep)
    _T["vllm_start"] = time.monotonic() - t0
    yield server
    if not keep:
        server.stop()


@pytest.fixture(scope="package")
def stack(vllm, tmp_path_factory):
    if not WASM.is_file() and not no_filter():
        pytest.fail(f"{WASM} is missing: run scripts/setup.sh", pytrace=False)
    s = Stack(vllm, tmp_path_factory.mktemp("sessions-envoy"))
    yield s
    s.stop()


def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run (the first test also waits for vLLM)."""
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE and \
                not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


def pytest_report_header(config):
    return [f"incontext sessions: envoy {envoy_binary() or 'NOT FOUND'}, wasm {WASM}"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "vllm_start" in _T:
        terminalreporter.write_line(
            f"incontext sessions: vLLM started in {_T['vllm_start']:.0f} s")
    for report in REPORTS:
        terminalreporter.write_line("incontext sessions: " + report.line())
    out = os.environ.get("INCONTEXT_SESSIONS_REPORT")
    if out and REPORTS:
        Path(out).write_text(json.dumps([
            {"session": r.name, "turns": len(r.turns), "answered": r.answered,
             "signals": r.signals, "output_tokens": r.output_tokens,
             "seconds": round(r.seconds, 1)} for r in REPORTS], indent=1))
