"""Fixtures for the real llama.cpp suite.

* ``llama``: one llama-server for the whole run (scripts/llamacpp.sh on a free port, its own
  state directory), stopped at the end. If the binary or the GGUF model is missing, or the
  server does not start, every test here FAILS (never skips): run scripts/setup-llamacpp.sh.
* ``proxy``: Envoy + incontext rendered from envoy/envoy.yaml with the `vllm` cluster pointed at
  that server and the llamacpp tokenizer backend, started on first use.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.servers import start_or_fail
from tests.llamacpp.stack import (WASM, Client, LlamaServer, no_filter,
                                  plugin_config, start_envoy)

HERE = Path(__file__).resolve().parent
_TIMINGS = {}


@pytest.fixture(scope="package")
def llama(tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llamacpp-state"))
    start_or_fail(server, "llama-server")
    _TIMINGS["start"] = server.start_seconds
    _TIMINGS["suite_start"] = time.monotonic()
    yield server
    server.stop()
    _TIMINGS["suite_end"] = time.monotonic()


@pytest.fixture(scope="package")
def proxy(llama, tmp_path_factory):
    if not WASM.is_file() and not no_filter():
        pytest.fail(f"{WASM} is missing: run scripts/setup.sh", pytrace=False)
    try:
        env = start_envoy(tmp_path_factory.mktemp("llamacpp-envoy"), "envoy-llamacpp",
                          llama.port, plugin_config(llama.port))
    except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the tests
        pytest.fail(f"Envoy with the llamacpp backend could not be started: {e}",
                    pytrace=False)
    client = Client(env)
    yield client
    client.close()
    env.stop()


def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run."""
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(120))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "start" in _TIMINGS:
        line = f"incontext llamacpp: llama-server started in {_TIMINGS['start']:.1f} s"
        if "suite_end" in _TIMINGS:
            line += (f"; tests with llama-server up took "
                     f"{_TIMINGS['suite_end'] - _TIMINGS['suite_start']:.0f} s")
        terminalreporter.write_line(line)
