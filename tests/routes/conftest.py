"""Fixtures of the routes suite: two real vLLM servers with different served names and windows
(tiny-a: 512 tokens, tiny-b: 1024), and Envoys with ONE incontext configuration whose `routes`
(docs/spec.md §16) send each model's count calls to its own server. Envoy routes the requests
themselves by an `x-model` header, as a gateway does once it read the model. A server that
cannot start fails every test."""

from __future__ import annotations

import threading

import pytest

from tests.harness.servers import StackError
from tests.render.servers import NamedVllm, cluster, start_envoy

R, F = 64, 32
MODELS = {"tiny-a": 512, "tiny-b": 1024}


@pytest.fixture(scope="package")
def servers(tmp_path_factory):
    started = {name: NamedVllm(tmp_path_factory.mktemp(f"routes-{name}"), name, window)
               for name, window in MODELS.items()}
    # Both start at once (each start mostly waits on imports and the model load).
    errors = {}

    def start(name):
        try:
            started[name].start()
        except (StackError, OSError) as e:
            errors[name] = e

    threads = [threading.Thread(target=start, args=(n,)) for n in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            pytest.fail("vLLM could not be started: " + "; ".join(
                f"{n}: {e}" for n, e in errors.items()), pytrace=False)
        yield started
    finally:
        for s in started.values():
            s.stop()


def routes_config(servers) -> dict:
    """No top-level tokenizer: a model no route names passes unchanged."""
    return {
        "min_output_tokens": R, "fallback_margin_tokens": F,
        "routes": [{"model": name, "tokenizer": {
            "cluster": f"tok-{name}", "authority": f"127.0.0.1:{s.port}", "timeout_ms": 30000}}
            for name, s in servers.items()],
    }


@pytest.fixture
def envoy_for(servers, tmp_path_factory):
    """A fresh Envoy (fresh shared data) per call: ``envoy_for(name)``."""
    started = []

    def make(name: str):
        clusters = []
        for model, s in servers.items():
            clusters += [cluster(f"tok-{model}", s.port), cluster(f"gen-{model}", s.port)]
        try:
            env = start_envoy(tmp_path_factory.mktemp(f"routes-envoy-{name}"), f"envoy-{name}",
                              servers["tiny-a"].port, routes_config(servers),
                              extra_clusters=clusters,
                              model_routes=[(m, f"gen-{m}") for m in servers])
        except Exception as e:  # noqa: BLE001 - any failure to start Envoy fails the test
            pytest.fail(f"Envoy ({name}) could not be started: {e}", pytrace=False)
        started.append(env)
        return env

    yield make
    for env in started:
        env.stop()
