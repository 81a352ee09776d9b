"""Shared by every suite under tests/ (one Python package: import helpers as
``tests.harness.envoy``, ``tests.e2e.common`` ...; pyproject.toml puts the repository root on
the path).

Ordering is declared, never implied by file names:

* ``@pytest.mark.last`` runs a test after every other test of the session (it stops a shared
  server, or reads the logs every other test produced);
* ``@pytest.mark.last("module")`` runs it after the other tests of its own module.

Everything else keeps pytest's order (files by name, tests in definition order).
"""

from __future__ import annotations


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
