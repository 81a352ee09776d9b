"""Fixtures for tests/sglang.

* ``sglang``: the real SGLang for the whole run (scripts/sglang.sh on a free port, its own
  state directory), stopped at the end; or the server at INCONTEXT_SGLANG_URL. If it cannot
  start, the tests that need it FAIL (never skip).
* ``stub``: tests/sglang/fake_sglang.py for the fault-injection tests.
* ``envoys``: Envoy + incontext instances, one per (server, name), started on first use.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.servers import start_or_fail
from tests.sglang.stack import (COUNT_LOG, Client, FakeSglang, Sglang,
                                plugin_config, start_envoy)

HERE = Path(__file__).resolve().parent
_TIMINGS = {}


class Envoys:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.envoys = {}
        self.clients = []

    def client(self, server, name: str, **changes) -> Client:
        """A client of the Envoy named ``name`` in front of ``server`` (started once)."""
        key = (id(server), name)
        env = self.envoys.get(key)
        if env is None or not env.alive():
            try:
                env = start_envoy(self.workdir, f"envoy-{name}", server,
                                  plugin_config(server, **changes))
            except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the test
                pytest.fail(f"Envoy ({name}) could not be started: {e}", pytrace=False)
            self.envoys[key] = env
        c = Client(env)
        self.clients.append(c)
        return c

    def stop(self):
        for c in self.clients:
            c.close()
        for env in self.envoys.values():
            env.stop()


@pytest.fixture(scope="package")
def sglang(tmp_path_factory):
    server = Sglang(tmp_path_factory.mktemp("sglang-state"))
    start_or_fail(server, "SGLang")
    _TIMINGS["sglang_start"] = server.start_seconds
    _TIMINGS["suite_start"] = time.monotonic()
    yield server
    server.stop()
    _TIMINGS["suite_end"] = time.monotonic()


@pytest.fixture(scope="package")
def stub(tmp_path_factory):
    server = FakeSglang(tmp_path_factory.mktemp("fake-sglang"))
    yield start_or_fail(server, "fake_sglang.py")
    server.stop()


@pytest.fixture(scope="package")
def envoys(tmp_path_factory):
    e = Envoys(tmp_path_factory.mktemp("sglang-envoy"))
    yield e
    e.stop()


def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run. The first test also waits for SGLang."""
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(900))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _TIMINGS.get("sglang_start") is not None:
        line = f"incontext sglang: SGLang started in {_TIMINGS['sglang_start']:.0f} s"
        if "suite_end" in _TIMINGS:
            line += (f"; tests with SGLang up took "
                     f"{_TIMINGS['suite_end'] - _TIMINGS['suite_start']:.0f} s")
        terminalreporter.write_line(line)
    if COUNT_LOG:
        ok = sum(1 for *_, ours, theirs in COUNT_LOG if ours == theirs)
        terminalreporter.write_line(
            f"incontext sglang: prompt counts compared with the server's usage: "
            f"{ok} equal of {len(COUNT_LOG)}")
        for server, shape, ours, theirs in COUNT_LOG:
            mark = "equal" if ours == theirs else "DIFFERENT"
            terminalreporter.write_line(
                f"  {server:6} {shape:34} filter={ours} server={theirs} {mark}")
