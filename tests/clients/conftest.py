"""Fixtures for the client suite: the real vLLM (0.32, CPU, tiny Qwen3, 512-token window) with
Envoy + incontext in front, and the official SDKs / LiteLLM pointed at Envoy.

* ``vllm``: one server for the whole run (scripts/vllm.sh on a free port, its own state
  directory, `--enable-scale-out` for the render API), stopped at the end. ``INCONTEXT_VLLM_TEST_STATE`` + ``INCONTEXT_VLLM_TEST_PORT``
  reuse a running one (then left running). If it cannot start, every test FAILS.
* ``stack.envoy(name, **changes)``: one Envoy per plugin configuration (tests/vllm's base
  configuration: context_length 512, R 64, F 32), started on first use.
* ``faults``: a scripted counter (tests/harness/upstream.py) answering 500, garbage or slowly,
  for the counter-failure tests: the only fake server here, used for fault injection only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import tests.clients.stack  # noqa: F401  (sets the LiteLLM offline switches before any import)
from tests.harness.servers import start_or_fail
from tests.clients.stack import C, Stack, Vllm
from tests.harness.envoy import WASM, Envoy, envoy_binary, no_filter
from tests.harness.upstream import Upstream

HERE = Path(__file__).resolve().parent
_T = {}
# vLLM serves its render API (/v1/responses/render: the exact count of a Responses request)
# only with this flag; it changes nothing else the suite sees.
SCALE_OUT = ("--enable-scale-out",)


@pytest.fixture(scope="package")
def vllm(tmp_path_factory):
    state = os.environ.get("INCONTEXT_VLLM_TEST_STATE")
    port = os.environ.get("INCONTEXT_VLLM_TEST_PORT")
    if state and port:
        server = Vllm(Path(state), int(port))
        keep = True         # started by someone else: left running
    else:
        server = Vllm(tmp_path_factory.mktemp("vllm-state"), extra_args=SCALE_OUT)
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
    s = Stack(vllm, tmp_path_factory.mktemp("clients-envoy"))
    yield s
    s.stop()


@pytest.fixture
def envoy(stack) -> Envoy:
    """Envoy + incontext: context_length 512, R 64, F 32, passthrough."""
    return stack.envoy("exact")


@pytest.fixture
def reject_envoy(stack) -> Envoy:
    return stack.envoy("reject", on_insufficient="reject")


@pytest.fixture(scope="package")
def faults():
    """A scripted Anthropic counter (POST /v1/messages/count_tokens) for fault injection."""
    up = Upstream(tokenizer_path="/v1/messages/count_tokens").start()
    yield up
    up.stop()


@pytest.fixture
def faulty_envoy(stack, faults) -> Envoy:
    """Envoy whose tokenizer cluster is the fault server (timeout 1 s); requests still go to
    the real vLLM."""
    faults.reset()
    cluster = {"name": "faulty", "type": "STATIC", "connect_timeout": "1s",
               "load_assignment": {"cluster_name": "faulty", "endpoints": [{"lb_endpoints": [
                   {"endpoint": {"address": {"socket_address": {
                       "address": faults.host, "port_value": faults.port}}}}]}]}}
    return stack.envoy("faulty", extra_clusters=[cluster],
                       tokenizer={"backend": "vllm", "cluster": "faulty",
                                  "authority": f"{faults.host}:{faults.port}",
                                  "timeout_ms": 1000})


def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run (the first test also waits for vLLM)."""
    for item in items:
        here = Path(str(item.fspath)).resolve().parent == HERE
        if here and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


def pytest_report_header(config):
    b = envoy_binary()
    return [f"incontext clients: window {C}, envoy {b or 'NOT FOUND'}, wasm {WASM}"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "vllm_start" in _T:
        terminalreporter.write_line(f"incontext clients: vLLM started in {_T['vllm_start']:.0f} s")
