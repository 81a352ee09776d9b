"""docs/spec.md §8: the plugin configuration. Envoy must refuse a bad one at startup, naming the field.

`envoy --mode validate` loads the build under test and runs its configuration (the wasm
filter's on_configure, the module's filter_config_new), so a refused plugin configuration is a
non-zero exit.
"""

import copy
import json

import pytest

from tests.e2e.common import MAIN, cfg
from tests.harness.envoy import (FILTER_LOG, Envoy, EnvoyError, no_filter, shipped_plugin_config,
                                 validate)


@pytest.fixture(scope="module")
def vdir(tmp_path_factory):
    return tmp_path_factory.mktemp("validate")


def run_validate(envoy_bin, vdir, plugin_config, glue):
    return validate(envoy_bin, vdir, plugin_config, glue=glue, name=f"validate-{glue}")


@pytest.mark.parametrize("name,plugin_config", [
    ("shipped", None),
    ("main", MAIN),
    ("minimal", {"tokenizer": {"cluster": "vllm"}}),
    ("full", {
        "tokenizer": {"backend": "vllm", "cluster": "vllm", "authority": "vllm:8000",
                      "path": "/tokenize", "timeout_ms": 30000,
                      "headers": {"authorization": "Bearer x"}},
        "model": "Qwen/Qwen3-8B", "context_length": 32768, "window_tokens": 32768,
        "min_output_tokens": 4096, "fallback_margin_tokens": 1024, "cache_entries": 4096,
        "max_body_bytes": 8388608, "on_insufficient": "passthrough", "response_headers": True}),
    ("model_list", cfg(model=["a", "b"])),
    ("reject", cfg(on_insufficient="reject")),
    ("zero_margin", cfg(fallback_margin_tokens=0)),
    ("window_below_context", cfg(window_tokens=20000)),
    ("just_fits", cfg(context_length=5121, min_output_tokens=4096, fallback_margin_tokens=1024)),
    ("routes", {"routes": [
        {"model": "coder", "tokenizer": {"cluster": "vllm"}, "context_length": 32768},
        {"model": ["small", "fast"], "tokenizer": {"cluster": "vllm", "backend": "sglang"},
         "window_tokens": 8192, "min_output_tokens": 1024, "on_insufficient": "reject"}]}),
    ("routes_over_top_level", cfg(routes=[{"model": "coder", "window_tokens": 16384}])),
    ("vllm_render", cfg(tokenizer={"backend": "vllm-render"})),
])
def test_valid_configs_are_accepted(envoy_bin, glue, vdir, name, plugin_config):
    pc = shipped_plugin_config() if plugin_config is None else plugin_config
    rc, out = run_validate(envoy_bin, vdir, pc, glue)
    assert rc == 0, f"valid config {name} refused (exit {rc}):\n{out[-3000:]}"


def _bad(**changes):
    return cfg(**changes)


def _tok(**changes):
    c = copy.deepcopy(MAIN)
    c["tokenizer"].update(changes)
    return c


def _without_cluster():
    c = copy.deepcopy(MAIN)
    del c["tokenizer"]["cluster"]
    return c


# (id, configuration, field names of which at least one must appear in the log)
REFUSED = [
    ("bad_json", '{"tokenizer": {"cluster": "vllm"', []),
    ("not_an_object", '["tokenizer"]', []),
    ("empty", "", []),
    ("unknown_key", _bad(max_tokens_override=5), ["max_tokens_override"]),
    ("unknown_tokenizer_key", _tok(url="http://x"), ["url"]),
    ("unknown_backend", _tok(backend="openai"), ["backend"]),
    ("missing_tokenizer", {"context_length": 32768}, ["tokenizer"]),
    ("missing_cluster", _without_cluster(), ["cluster"]),
    ("R_zero", _bad(min_output_tokens=0), ["min_output_tokens"]),
    ("R_negative", _bad(min_output_tokens=-1), ["min_output_tokens"]),
    ("F_negative", _bad(fallback_margin_tokens=-1), ["fallback_margin_tokens"]),
    ("W_gt_C", _bad(window_tokens=40000), ["window_tokens", "context_length"]),
    ("F_ge_W", _bad(window_tokens=2000, fallback_margin_tokens=2000, min_output_tokens=100),
     ["fallback_margin_tokens", "window_tokens"]),
    ("R_ge_W", _bad(window_tokens=4096, fallback_margin_tokens=0),
     ["min_output_tokens", "window_tokens"]),
    ("F_plus_R_eq_W", _bad(context_length=5120), ["fallback_margin_tokens", "min_output_tokens",
                                                  "window_tokens", "context_length"]),
    ("F_plus_R_gt_W", _bad(window_tokens=5000), ["fallback_margin_tokens", "min_output_tokens",
                                                 "window_tokens"]),
    ("timeout_zero", _tok(timeout_ms=0), ["timeout_ms"]),
    ("timeout_negative", _tok(timeout_ms=-5), ["timeout_ms"]),
    ("cache_entries_zero", _bad(cache_entries=0), ["cache_entries"]),
    ("max_body_bytes_zero", _bad(max_body_bytes=0), ["max_body_bytes"]),
    ("on_insufficient_unknown", _bad(on_insufficient="drop"), ["on_insufficient"]),
    ("wrong_type", _bad(min_output_tokens="4096x"), ["min_output_tokens"]),
    # docs/spec.md §16: every route is checked as a whole configuration, its field named.
    ("route_twice_one_model", cfg(routes=[{"model": "a"}, {"model": ["b", "a"]}]),
     ["routes[1].model"]),
    ("route_without_tokenizer", {"routes": [{"model": "a", "tokenizer": {"cluster": "vllm"}},
                                            {"model": "b"}]}, ["routes[1].tokenizer"]),
    ("route_tokenizer_without_cluster", cfg(routes=[{"model": "a"}, {"model": "b", "tokenizer": {}}]),
     ["routes[1].tokenizer.cluster"]),
    ("route_unknown_key", cfg(routes=[{"model": "a", "max_body_bytes": 5}]),
     ["routes[0].max_body_bytes"]),
    ("route_window_too_small", cfg(routes=[{"model": "a", "context_length": 4096}]),
     ["routes[0].min_output_tokens", "routes[0].fallback_margin_tokens"]),
    ("route_without_model", cfg(routes=[{"context_length": 8192}]), ["routes[0].model"]),
]


@pytest.mark.parametrize("name,plugin_config,fields", REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_configs_are_refused(envoy_bin, glue, vdir, name, plugin_config, fields):
    rc, out = run_validate(envoy_bin, vdir, plugin_config, glue)
    assert rc != 0, f"config {name} was accepted; log tail:\n{out[-2000:]}"
    if fields:
        filter_lines = "\n".join(l for l in out.splitlines() if FILTER_LOG[glue] in l)
        assert any(f in filter_lines for f in fields), (
            f"no filter log line names {fields} for {name}:\n{out[-3000:]}")


def test_refused_config_stops_envoy_start(envoy_bin, glue, upstream, tmp_path):
    env = Envoy(envoy_bin, tmp_path, cfg(window_tokens=5000), (upstream.host, upstream.port),
                remove_filter=no_filter(), refusal_expected=True, glue=glue)
    try:
        with pytest.raises(EnvoyError):
            env.start(timeout=30)
    finally:
        env.stop()
    filter_lines = "\n".join(l for l in env.log_text().splitlines() if FILTER_LOG[glue] in l)
    assert "fallback_margin_tokens" in filter_lines or "min_output_tokens" in filter_lines


def test_shipped_config_is_the_documented_one():
    pc = shipped_plugin_config()
    assert pc["tokenizer"]["cluster"] == "vllm"
    assert pc["tokenizer"]["authority"] == "vllm:8000"
    assert json.loads(json.dumps(pc)) == pc
