"""Shared by every suite under tests/ (one Python package: import helpers as
``tests.harness.envoy``, ``tests.e2e.common`` ...; pyproject.toml puts the repository root on
the path).

Ordering is declared, never implied by file names:

* ``@pytest.mark.last`` runs a test after every other test of the session (it stops a shared
  server, or reads the logs every other test produced);
* ``@pytest.mark.last("module")`` runs it after the other tests of its own module.

Everything else keeps pytest's order (files by name, tests in definition order).

Every Envoy a test started (tests.harness.envoy registers each) has its log read when the
session ends: a wasm failure, an unexpected [critical] line or a missing log is an error at
the teardown of the last test.
"""

from __future__ import annotations

import pytest

from tests.harness import envoy as _envoy


@pytest.fixture(scope="session", autouse=True)
def _every_envoy_log_is_read():
    yield
    _, problems = _envoy.check_logs()
    if problems:
        pytest.fail("Envoy logs with wasm failures or no log:\n" + "\n".join(problems[:20]),
                    pytrace=False)


def _last_scope(item):
    mark = item.get_closest_marker("last")
    if mark is None:
        return None
    scope = mark.args[0] if mark.args else "session"
    if scope not in ("session", "module"):
        raise ValueError(f"{item.nodeid}: pytest.mark.last takes 'session' or 'module', not {scope!r}")
    return scope


def pytest_collection_modifyitems(config, items):
    modules = {}
    for item in items:
        modules.setdefault(item.module.__name__ if item.module else item.nodeid, len(modules))

    def key(item):
        scope = _last_scope(item)
        module = modules[item.module.__name__ if item.module else item.nodeid]
        return (scope == "session", module, scope == "module")

    items[:] = sorted(items, key=key)   # stable: the order within each group is kept


# Wall time per suite directory (tests/NAME) and per file, summed over their tests (fixture setup
# and teardown included), printed after the run: where a run's time goes.
_SUITE_TIME = {}
_FILE_TIME = {}


def _suite(nodeid: str) -> str:
    parts = nodeid.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time
    t0 = time.monotonic()
    yield
    took = time.monotonic() - t0
    suite = _suite(item.nodeid)
    _SUITE_TIME[suite] = _SUITE_TIME.get(suite, 0.0) + took
    path = item.nodeid.split("::")[0]
    _FILE_TIME[path] = _FILE_TIME.get(path, 0.0) + took


def pytest_terminal_summary(terminalreporter):
    if _SUITE_TIME:
        terminalreporter.write_line("incontext timing: " + ", ".join(
            f"{s} {t:.0f} s" for s, t in sorted(_SUITE_TIME.items(), key=lambda x: -x[1])))
        slowest = sorted(_FILE_TIME.items(), key=lambda x: -x[1])[:15]
        terminalreporter.write_line("incontext timing, slowest files: " + ", ".join(
            f"{f} {t:.0f} s" for f, t in slowest))
