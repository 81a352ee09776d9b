"""Fixtures for the real-vLLM suite.

* ``vllm_release``: the suite runs once per vLLM release (INCONTEXT_VLLM_RELEASES, default
  every release with a scripts/vllm-requirements*.txt), newest first; tests marked
  ``newest_vllm_only`` run on the newest selected release only, tests marked
  ``needs_messages_api`` only on releases that serve the Anthropic Messages API.
* ``vllm``: one vLLM server per release (scripts/vllm.sh on a free port, its own state
  directory), started before that release's tests and stopped after them, so only one runs at
  a time. If it cannot start, every test of that release FAILS (never skips).
* ``stack``: Envoy instances rendered from envoy/envoy.yaml with the `vllm` cluster pointed at
  that server, one per plugin configuration, started on first use and stopped at the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.harness.servers import start_or_fail
from tests.vllm.stack import (COUNT_LOG, NO_MESSAGES_API, WASM, Client, StackError, Vllm,
                              free_port, no_filter, plugin_config, selected_releases, start_envoy)

HERE = Path(__file__).resolve().parent
_TIMINGS = {}   # release -> {"vllm_start": s, "suite_start": t, "suite_end": t, ...}
try:
    RELEASES = selected_releases()
    _RELEASE_ERROR = None
except StackError as e:
    RELEASES, _RELEASE_ERROR = [], str(e)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "newest_vllm_only: run on the newest selected vLLM release only "
        "(behaviour of the filter that does not depend on the vLLM release)")
    config.addinivalue_line(
        "markers", "needs_messages_api: run only on vLLM releases that serve /v1/messages")
    config.addinivalue_line(
        "markers", "phase(n): run after the release's tests of lower phases (default 0): the "
        "tests that stop or restart the release's server declare their order this way")


def pytest_generate_tests(metafunc):
    if "vllm_release" not in metafunc.fixturenames:
        return
    if _RELEASE_ERROR:
        raise pytest.UsageError(_RELEASE_ERROR)
    releases = RELEASES
    if metafunc.definition.get_closest_marker("newest_vllm_only"):
        releases = RELEASES[:1]
    if metafunc.definition.get_closest_marker("needs_messages_api"):
        releases = [r for r in releases if r not in NO_MESSAGES_API]
    metafunc.parametrize("vllm_release", releases, indirect=True, scope="session",
                         ids=[f"vllm{r}" for r in releases])


@pytest.fixture(scope="session")
def vllm_release(request) -> str:
    return request.param


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
def vllm(vllm_release, tmp_path_factory):
    # For iterating on the tests: INCONTEXT_VLLM_TEST_STATE + INCONTEXT_VLLM_TEST_PORT reuse a
    # server started with `INCONTEXT_VLLM_STATE=dir scripts/vllm.sh start port` (left running);
    # with INCONTEXT_VLLM_RELEASE=R for a release other than the default, and then
    # INCONTEXT_VLLM_RELEASES=R for the suite.
    state = os.environ.get("INCONTEXT_VLLM_TEST_STATE")
    port = os.environ.get("INCONTEXT_VLLM_TEST_PORT")
    if state and port:
        if len(RELEASES) != 1:
            pytest.fail("INCONTEXT_VLLM_TEST_PORT reuses one server: select its release with "
                        "INCONTEXT_VLLM_RELEASES", pytrace=False)
        server = Vllm(Path(state), int(port), release=vllm_release)
        keep = server.healthy()
    else:
        server = Vllm(tmp_path_factory.mktemp(f"vllm-{vllm_release}-state"), release=vllm_release)
        keep = False
    timings = _TIMINGS.setdefault(vllm_release, {})
    t0 = time.monotonic()
    start_or_fail(server, f"vLLM {vllm_release}")
    timings["vllm_start"] = time.monotonic() - t0
    timings["suite_start"] = time.monotonic()
    yield server
    if not keep:
        server.stop()
    timings["suite_end"] = time.monotonic()
    timings["vllm_starts"] = list(server.start_seconds)


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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """A hang must fail the test, not the run. The first test also waits for vLLM to start.

    One release at a time: this suite's tests run as one block, at the place of its first
    test, grouped by vLLM release, newest first (so each release's server starts once and is
    stopped before the next starts), in the order given within each release (tests marked
    `pytest.mark.last` end their release's group, ordered among themselves by
    `pytest.mark.phase`)."""
    mine = [item for item in items if Path(str(item.fspath)).resolve().parent == HERE]
    if not mine:
        return
    for item in mine:
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))

    def rank(item):
        spec = getattr(item, "callspec", None)
        release = spec.params.get("vllm_release") if spec else None
        phase = item.get_closest_marker("phase")
        return (RELEASES.index(release) if release in RELEASES else len(RELEASES),
                phase.args[0] if phase else 0)

    ids = {id(item) for item in mine}
    first = next(i for i, item in enumerate(items) if id(item) in ids)
    rest = [item for item in items if id(item) not in ids]
    items[:] = rest[:first] + sorted(mine, key=rank) + rest[first:]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for release, t in _TIMINGS.items():
        if "vllm_start" not in t:
            continue
        line = f"incontext vllm {release}: vLLM started in {t['vllm_start']:.0f} s"
        starts = t.get("vllm_starts", [])
        if len(starts) > 1:
            line += " (restarts: " + ", ".join(f"{s:.0f} s" for s in starts[1:]) + ")"
        if "suite_end" in t:
            line += f"; tests with vLLM up took {t['suite_end'] - t['suite_start']:.0f} s"
        terminalreporter.write_line(line)
    if COUNT_LOG:
        ok = sum(1 for *_, ours, theirs in COUNT_LOG if ours == theirs)
        terminalreporter.write_line(
            f"incontext vllm: prompt counts compared with vLLM usage.prompt_tokens: "
            f"{ok} equal of {len(COUNT_LOG)}")
        for cfg, shape, ours, theirs in COUNT_LOG:   # cfg names the release
            mark = "equal" if ours == theirs else "DIFFERENT"
            terminalreporter.write_line(
                f"  {cfg:22} {shape:44} filter={ours} vllm={theirs} {mark}")
