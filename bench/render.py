#!/usr/bin/env python3
"""Renders the three Envoy configs of a bench run from envoy/envoy.yaml.

    render.py OUTDIR WASM UPSTREAM_PORT FILTER_PORT NOFILTER_PORT ADMIN_BASE [EXTRA_PLUGIN_JSON]
              [MODULE_PORT]

  upstream.yaml  the fast upstream: POST /tokenize -> {"count":1000,"max_model_len":32768},
                 /v1/messages/count_tokens -> {"input_tokens":1000}, /v1/messages -> a
                 streamed Anthropic answer (text/event-stream, 40 text deltas, stopped at the
                 cap the filter writes, 31768: the answer the filter watches and whose stop
                 reason it reports as the window's), anything else -> a small chat completion
                 JSON (direct responses; a buffer
                 filter first, so the whole request body is read before answering and the
                 HTTP/1.1 connection stays reusable). Admin on ADMIN_BASE.
  filter.yaml    envoy/envoy.yaml as shipped, with only the run-specific changes: loopback
                 listener and admin addresses, the `vllm` cluster pointed at the upstream, the
                 wasm path, and `context_length: 32768` (plus EXTRA_PLUGIN_JSON, a JSON object
                 merged into the plugin configuration). Admin on ADMIN_BASE+1.
  nofilter.yaml  the same config without the wasm filter (buffer filter and router kept).
                 Admin on ADMIN_BASE+2.
  module.yaml    with MODULE_PORT: envoy/envoy-module.yaml (the native module, no buffer
                 filter) with the same changes (no wasm path: Envoy finds the module through
                 ENVOY_DYNAMIC_MODULES_SEARCH_PATH). Admin on ADMIN_BASE+3.
"""

import copy
import json
import os
import sys

import yaml

WASM_FILTER = "envoy.filters.http.wasm"
MODULE_FILTER = "envoy.filters.http.dynamic_modules"
TOKENIZE_REPLY = '{"count":1000,"max_model_len":32768}'
CHAT_REPLY = ('{"id":"chatcmpl-bench","object":"chat.completion","model":"qwen3-coder",'
              '"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
              '"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":1,'
              '"total_tokens":1001}}')
COUNT_REPLY = '{"input_tokens":1000}'
# The cap the filter writes on a Messages request of 1000 tokens in a 32768 window (exact
# count: no margin), so the answer used all of it.
WATCHED_CAP = 32768 - 1000


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


STREAM_REPLY = "".join(
    [sse("message_start", {"type": "message_start", "message": {
        "id": "msg_bench", "type": "message", "role": "assistant", "model": "qwen3-coder",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1000, "output_tokens": 1}}}),
     sse("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}})]
    + [sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": f"word{i} "}})
       for i in range(40)]
    + [sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
       sse("message_delta", {"type": "message_delta",
                             "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                             "usage": {"output_tokens": WATCHED_CAP}}),
       sse("message_stop", {"type": "message_stop"})])
LIMIT = 16 * 1024 * 1024


def hcm(cfg):
    for f in cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]:
        if f["name"] == "envoy.filters.network.http_connection_manager":
            return f["typed_config"]
    raise KeyError("no http_connection_manager in envoy/envoy.yaml")


def plugin_json(value, extra):
    """The plugin configuration as the bench runs it: the shipped one, context_length 32768,
    EXTRA merged."""
    plugin = json.loads(value)
    plugin["context_length"] = 32768
    plugin.update(extra)
    return json.dumps(plugin)


def addresses(shipped, port, admin, upstream_port):
    """A copy of a shipped config on loopback, its `vllm` cluster pointed at the upstream."""
    cfg = copy.deepcopy(shipped)
    cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin)
    listener = cfg["static_resources"]["listeners"][0]
    listener["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
    vllm = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "vllm")
    sa = vllm["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]
    sa.update(address="127.0.0.1", port_value=upstream_port)
    return cfg


def proxy(shipped, wasm, port, admin, upstream_port, extra, with_filter):
    cfg = addresses(shipped, port, admin, upstream_port)
    h = hcm(cfg)
    if with_filter:
        wf = next(f for f in h["http_filters"] if f["name"] == WASM_FILTER)
        conf = wf["typed_config"]["config"]
        conf["vm_config"]["code"]["local"]["filename"] = wasm
        conf["configuration"]["value"] = plugin_json(conf["configuration"]["value"], extra)
    else:
        h["http_filters"] = [f for f in h["http_filters"] if f["name"] != WASM_FILTER]
    return cfg


def module_proxy(shipped, port, admin, upstream_port, extra):
    cfg = addresses(shipped, port, admin, upstream_port)
    mf = next(f for f in hcm(cfg)["http_filters"] if f["name"] == MODULE_FILTER)
    conf = mf["typed_config"]["filter_config"]
    conf["value"] = plugin_json(conf["value"], extra)
    return cfg


def upstream(port, admin):
    def direct(body, content_type="application/json"):
        return {"direct_response": {"status": 200, "body": {"inline_string": body}},
                "response_headers_to_add": [
                    {"header": {"key": "content-type", "value": content_type}}]}

    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {"listeners": [{
            "name": "upstream",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "per_connection_buffer_limit_bytes": LIMIT,
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network."
                             "http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "upstream",
                    "route_config": {"max_direct_response_body_size_bytes": 65536,
                                     "virtual_hosts": [{
                        "name": "all", "domains": ["*"],
                        "routes": [
                            {"match": {"path": "/tokenize"}, **direct(TOKENIZE_REPLY)},
                            {"match": {"path": "/v1/messages/count_tokens"}, **direct(COUNT_REPLY)},
                            {"match": {"path": "/v1/messages"},
                             **direct(STREAM_REPLY, "text/event-stream")},
                            {"match": {"prefix": "/"}, **direct(CHAT_REPLY)},
                        ]}]},
                    "http_filters": [
                        {"name": "envoy.filters.http.buffer", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                            "max_request_bytes": LIMIT}},
                        {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                    ]}}]}]}]},
    }


def main():
    outdir, wasm = sys.argv[1], sys.argv[2]
    up, fport, nport, admin = (int(x) for x in sys.argv[3:7])
    extra = json.loads(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] else {}
    mport = int(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] else None
    envoy_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "envoy")
    config = os.environ.get("BENCH_ENVOY_CONFIG") or os.path.join(envoy_dir, "envoy.yaml")
    with open(config, encoding="utf-8") as f:
        shipped = yaml.safe_load(f)
    out = {
        "upstream": upstream(up, admin),
        "filter": proxy(shipped, wasm, fport, admin + 1, up, extra, True),
        "nofilter": proxy(shipped, wasm, nport, admin + 2, up, extra, False),
    }
    if mport is not None:
        with open(os.path.join(envoy_dir, "envoy-module.yaml"), encoding="utf-8") as f:
            out["module"] = module_proxy(yaml.safe_load(f), mport, admin + 3, up, extra)
    for name, cfg in out.items():
        with open(f"{outdir}/{name}.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)


if __name__ == "__main__":
    main()
