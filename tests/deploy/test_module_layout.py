"""The native module's Envoy Gateway layout (deploy/kubernetes/envoy-gateway-module/), run in
the real Envoy with the built module.

Envoy Gateway turns the EnvoyExtensionPolicy's `dynamicModule` entry and the EnvoyProxy's
`dynamicModules` registration into (envoyproxy/gateway v1.8.0, internal/gatewayapi/
envoyextensionpolicy.go and internal/xds/translator/dynamicmodule.go): one HCM filter of type
DynamicModuleFilter named
`envoy.filters.http.dynamic_modules/envoyextensionpolicy/<namespace>/<policy>/dynamic-module/<i>`,
`disabled: true`, that loads the module from the registered path
(`dynamic_module_config.module.local.filename`, with `do_not_close`), with `filter_name` =
filterName and `filter_config` = the policy's `config` as a JSON string (a
google.protobuf.StringValue); the route enables it with an empty FilterConfig. The listener's buffer limit is the ClientTrafficPolicy's. That chain is built
here from the shipped manifests, the module path pointed at the built module, and one request
goes through it to a fake vLLM: it is counted and rewritten. The same chain without the
route's FilterConfig leaves the request alone, so the check can fail.

Needs the Envoy of .venv (tests/requirements.txt) and target/module/libincontext_module.so
(scripts/build-module.sh); without them the tests fail.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from tests.harness import layouts
from tests.harness.envoy import MODULE, Envoy, envoy_binary
from tests.harness.upstream import Upstream

LAYOUT = "envoy-gateway-module"
DM_TYPE = "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
PROMPT_TOKENS = 25
WINDOW = 32768


def module_gateway(listen_port: int, admin_port: int, upstream, module_path: str,
                   enable_on_route: bool = True) -> dict:
    """The bootstrap Envoy Gateway's translation of the layout amounts to."""
    eep = layouts.manifest(f"{LAYOUT}/extension-policy.yaml", "EnvoyExtensionPolicy")
    proxy = layouts.manifest(f"{LAYOUT}/envoy-proxy.yaml", "EnvoyProxy")
    (dm,) = eep["spec"]["dynamicModule"]
    (entry,) = [m for m in proxy["spec"]["dynamicModules"] if m["name"] == dm["name"]]
    assert entry["source"]["local"]["path"].endswith("/" + Path(module_path).name), entry
    meta = eep["metadata"]
    name = ("envoy.filters.http.dynamic_modules/envoyextensionpolicy/"
            f"{meta['namespace']}/{meta['name']}/dynamic-module/0")
    module = layouts._typed(DM_TYPE, **{
        "dynamic_module_config": {"module": {"local": {"filename": module_path}},
                                  "do_not_close": bool(entry.get("doNotClose", False))},
        "filter_name": dm.get("filterName", ""),
        "filter_config": layouts._typed("google.protobuf.StringValue",
                                        value=json.dumps(dm["config"])),
    })
    http_filters = [{"name": name, "disabled": True, "typed_config": module},
                    dict(layouts.ROUTER)]
    per_route = ({name: layouts._typed("envoy.config.route.v3.FilterConfig", config={})}
                 if enable_on_route else {})
    cluster = dm["config"]["tokenizer"]["cluster"]   # httproute/llm/vllm-module/rule/0
    ctp = layouts.manifest(f"{LAYOUT}/client-traffic-policy.yaml", "ClientTrafficPolicy")
    rule = layouts.manifest(f"{LAYOUT}/gateway.yaml", "HTTPRoute")["spec"]["rules"][0]
    route = {"match": {"prefix": rule["matches"][0]["path"]["value"]},
             "route": {"cluster": cluster, "timeout": rule["timeouts"]["request"]},
             "typed_per_filter_config": per_route}
    limit = layouts.quantity(ctp["spec"]["connection"]["bufferLimit"])
    return layouts._bootstrap(admin_port, layouts._listener(listen_port, limit, http_filters,
                                                            route, "eg"),
                              layouts._cluster(cluster, upstream))


@pytest.fixture
def upstream():
    up = Upstream().start()
    up.tokenizer.count(PROMPT_TOKENS, max_model_len=WINDOW)
    yield up
    up.stop()


def run(tmp_path, upstream, enable_on_route: bool):
    binary = envoy_binary()
    if not binary:
        pytest.fail("Envoy binary not found: run scripts/setup.sh", pytrace=False)
    if not MODULE.is_file():
        pytest.fail(f"{MODULE} is missing: run scripts/build-module.sh", pytrace=False)
    envoy = Envoy(binary, tmp_path, None, None, glue="module",
                  name="eg-module" if enable_on_route else "eg-module-off",
                  config=lambda port, admin: module_gateway(
                      port, admin, (upstream.host, upstream.port), str(MODULE), enable_on_route))
    envoy.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=30)
        body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 100000,
                           "messages": [{"role": "user", "content": "hello"}]})
        conn.request("POST", "/v1/chat/completions", body,
                      {"content-type": "application/json", "host": "llm.example.com"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp, envoy.counters()
    finally:
        envoy.stop()


def test_module_layout_counts_and_rewrites_in_envoy(tmp_path, upstream):
    resp, counters = run(tmp_path, upstream, enable_on_route=True)
    assert resp.status == 200, resp.status
    assert resp.getheader("x-incontext-action") == "rewritten", resp.getheaders()
    assert resp.getheader("x-incontext-max-tokens") == str(WINDOW - PROMPT_TOKENS)
    (call,) = upstream.tokenizer.snapshot()
    eep = layouts.manifest(f"{LAYOUT}/extension-policy.yaml", "EnvoyExtensionPolicy")
    authority = eep["spec"]["dynamicModule"][0]["config"]["tokenizer"]["authority"]
    assert (call.header(":authority") or call.header("host")) == authority
    (sent,) = upstream.snapshot()
    assert sent.path == "/v1/chat/completions"
    assert json.loads(sent.body)["max_tokens"] == WINDOW - PROMPT_TOKENS
    assert counters["incontext_requests"] == 1 and counters["incontext_rewritten"] == 1, counters


def test_module_layout_without_the_route_enabling_it_passes_requests_unchanged(tmp_path, upstream):
    resp, counters = run(tmp_path, upstream, enable_on_route=False)
    assert resp.status == 200, resp.status
    assert resp.getheader("x-incontext-action") is None, resp.getheaders()
    assert upstream.tokenizer.snapshot() == []
    (sent,) = upstream.snapshot()
    assert json.loads(sent.body)["max_tokens"] == 100000
    assert counters.get("incontext_requests", 0) == 0, counters
