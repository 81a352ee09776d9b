"""Fixtures of the render suite: one real vLLM generation server and one real vLLM render
server (scripts/render.sh, from the same virtualenv and model, with the same window and tool
flags), and Envoys in front of the generation server whose incontext counts with the render
server (`vllm-render`, docs/spec.md §16). A server that cannot start fails every test."""

from __future__ import annotations

import pytest

from tests.harness.servers import start_or_fail
from tests.render.servers import NamedVllm, RenderServer, cluster, start_envoy
from tests.vllm.stack import Client

MODEL = "qwen3-tiny"
WINDOW = 1024
R, F = 64, 32


@pytest.fixture(scope="package")
def gen(tmp_path_factory):
    server = NamedVllm(tmp_path_factory.mktemp("render-gen"), MODEL, WINDOW)
    start_or_fail(server, "vLLM (generation)")
    yield server
    server.stop()


@pytest.fixture(scope="package")
def render(tmp_path_factory):
    server = RenderServer(tmp_path_factory.mktemp("render-server"), MODEL, WINDOW)
    start_or_fail(server, "vLLM render server")
    yield server
    server.stop()


def render_config(port: int, **changes) -> dict:
    cfg = {"tokenizer": {"backend": "vllm-render", "cluster": "render",
                         "authority": f"127.0.0.1:{port}", "timeout_ms": 30000},
           "min_output_tokens": R, "fallback_margin_tokens": F}
    cfg.update(changes)
    return cfg


class Envoys:
    def __init__(self, gen, render, workdir):
        self.gen, self.render, self.workdir = gen, render, workdir
        self.envoys, self.clients = {}, []

    def client(self, name: str, counter_port: int, **changes) -> Client:
        env = self.envoys.get(name)
        if env is None:
            try:
                env = start_envoy(self.workdir, f"envoy-{name}", self.gen.port,
                                  render_config(counter_port, **changes),
                                  extra_clusters=[cluster("render", counter_port)])
            except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the test
                pytest.fail(f"Envoy ({name}) could not be started: {e}", pytrace=False)
            self.envoys[name] = env
        c = Client(env)
        self.clients.append(c)
        return c

    def stop(self):
        for c in self.clients:
            c.close()
        for env in self.envoys.values():
            env.stop()


@pytest.fixture(scope="package")
def envoys(gen, render, tmp_path_factory):
    e = Envoys(gen, render, tmp_path_factory.mktemp("render-envoy"))
    yield e
    e.stop()


@pytest.fixture
def counted(envoys, render) -> Client:
    """incontext counting with the render server; the window learned from its /v1/models."""
    return envoys.client("render", render.port)
