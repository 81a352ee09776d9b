"""Two filter configurations that share their shared data (docs/spec.md §6 "Scope").

Envoy shares one VM's shared data between every filter configuration with the same `vm_id`;
the module's table is one per Envoy process, shared by every filter configuration
(docs/module.md). Two listeners, each with its own incontext configuration and no `context_length`, sit in
front of two tokenizers that serve the same model name with different windows (`max_model_len`
32768 and 16384). Each listener must budget with its own window — on the exact path, the
estimate path and token-id prompts — whichever listener learns its window first.
"""

from __future__ import annotations

import copy
import json

import httpx
import pytest
import yaml

from tests.e2e.common import MAIN, F, chat, completion, dumps
from tests.harness.envoy import MODULE_FILTER, WASM_FILTER, Envoy, free_port
from tests.harness.spec import estimates
from tests.harness.upstream import Upstream, ok

C_A, C_B = 32768, 16384
CAP = 1_000_000


def _config(cluster: str) -> dict:
    cfg = copy.deepcopy(MAIN)
    cfg.pop("context_length")
    cfg["tokenizer"]["cluster"] = cluster
    cfg["tokenizer"]["authority"] = cluster
    return cfg


@pytest.fixture
def pair(envoy_bin, glue, tmp_path):
    """Upstreams A and B and one Envoy with a listener in front of each; the two filter
    configurations share the shipped `vm_id` (wasm), or the process (module)."""
    a, b = Upstream().start(), Upstream().start()
    a.tokenizer.always(ok(100, max_model_len=C_A))
    b.tokenizer.always(ok(100, max_model_len=C_B))
    env = Envoy(envoy_bin, tmp_path, _config("vllm"), (a.host, a.port), name=f"shared-{glue}",
                glue=glue)
    cfg = env.cfg
    clusters = cfg["static_resources"]["clusters"]
    vllm_b = copy.deepcopy(next(c for c in clusters if c["name"] == "vllm"))
    vllm_b["name"] = "vllm_b"
    vllm_b["load_assignment"]["cluster_name"] = "vllm_b"
    vllm_b["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"].update(address=b.host, port_value=b.port)
    clusters.append(vllm_b)
    listener_b = copy.deepcopy(cfg["static_resources"]["listeners"][0])
    listener_b["name"] = "llm_b"
    port_b = free_port()
    listener_b["address"]["socket_address"]["port_value"] = port_b
    hcm = listener_b["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["stat_prefix"] = "llm_b"
    hcm["route_config"]["name"] = "llm_b"
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = "vllm_b"
    if glue == "wasm":
        wasm_b = next(f for f in hcm["http_filters"] if f["name"] == WASM_FILTER)
        plugin = wasm_b["typed_config"]["config"]
        plugin["configuration"]["value"] = json.dumps(_config("vllm_b"))
        vm_a = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]["http_filters"][0]["typed_config"]["config"]["vm_config"]["vm_id"]
        assert plugin["vm_config"]["vm_id"] == vm_a, "both configurations share one vm_id"
    else:
        module_b = next(f for f in hcm["http_filters"] if f["name"] == MODULE_FILTER)
        module_b["typed_config"]["filter_config"]["value"] = json.dumps(_config("vllm_b"))
    cfg["static_resources"]["listeners"].append(listener_b)
    env.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env.start()
    urls = {"a": env.url, "b": f"http://127.0.0.1:{port_b}"}
    yield urls, a, b
    env.stop()
    a.stop()
    b.stop()


def post(url: str, body: dict, path="/v1/chat/completions") -> httpx.Response:
    return httpx.post(url + path, content=dumps(body),
                      headers={"content-type": "application/json"}, timeout=30)


def max_tokens(res: httpx.Response) -> int:
    assert res.status_code == 200, res.text[:300]
    assert res.headers.get("x-incontext-action") == "rewritten", dict(res.headers)
    return int(res.headers["x-incontext-max-tokens"])


@pytest.mark.parametrize("first", ["a", "b"])
def test_each_listener_keeps_its_own_window(pair, first):
    urls, a, b = pair
    window = {"a": C_A, "b": C_B}
    order = [first, "b" if first == "a" else "a"]
    # Exact: each tokenizer reports its own max_model_len, which is learned for its route.
    for name in order:
        res = post(urls[name], chat(max_tokens=CAP))
        assert res.headers.get("x-incontext-source") == "exact"
        assert max_tokens(res) == window[name] - 100, name
    # Token-id prompts (no tokenizer call) and the estimate (tokenizers failing) use the
    # window learned for their own route.
    a.tokenizer.always(ok(0, max_model_len=0))   # a contract failure: estimate
    b.tokenizer.always(ok(0, max_model_len=0))
    for name in order:
        res = post(urls[name], completion(prompt=[1, 2, 3, 4, 5], max_tokens=CAP),
                   path="/v1/completions")
        assert max_tokens(res) == window[name] - 5, name
        body = chat(max_tokens=CAP)
        res = post(urls[name], body)
        assert res.headers.get("x-incontext-source") == "estimate", dict(res.headers)
        P = int(res.headers["x-incontext-prompt-tokens"])
        assert P in estimates(dumps(body)), P
        assert max_tokens(res) == window[name] - P - F, name
