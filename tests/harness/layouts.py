"""Envoy bootstraps that run the HTTP filter chain each shipped layout produces.

Every layout is one listener in front of one cluster (the recording upstream), with the HTTP
filters in the order the gateway builds them and the plugin configuration taken from the
shipped manifest. Only what a test run needs is changed: addresses and ports, the wasm path,
and the plugin configuration's ``on_insufficient`` (``reject``, so that a rejection can be
observed). Filters the gateways add that upstream Envoy does not have (Istio's ``istio.alpn``
and ``istio.stats``) are left out; neither holds nor buffers a request.

Where each order comes from:

* Istio (istio/istio, pilot/pkg/networking/core/listener_builder.go, buildHTTPConnectionManager,
  read at 86c9f01, 2026-08-22). For a gateway or a sidecar the HTTP filters are, in order:
  metadata exchange (sidecars only), the CUSTOM ext_authz filters, TrafficExtensions of phase
  AUTHN, the authentication filters, phase AUTHZ, the authorization filters (RBAC), phase
  STATS, then unspecified phase, then grpc_stats, istio.alpn, fault, cors, the telemetry
  filters (istio.stats), the router. A WasmPlugin becomes a TrafficExtension with the same
  phase (pilot/pkg/config/kube/extensions/translate.go) named
  ``<name>~istio-translated-wasmplugin``; its filter is delivered by ECDS
  (pilot/pkg/networking/core/extension/extensionfilter.go), HTTP filter name
  ``extensions.istio.io/trafficextension/<ns>.<name>``, and its PluginConfig
  (pilot/pkg/model/extensions.go) has name ``<ns>.<name>``, root_id = pluginName, the
  pluginConfig serialised as a JSON string, runtime v8, failure_policy from failStrategy and
  **no vm_id**. Without RequestAuthentication / AuthorizationPolicy the phases AUTHN, AUTHZ,
  STATS and unspecified all give the same chain: nothing that holds a request sits between the
  Wasm filter and the router. ECDS is reproduced with a file-based config source.
* Envoy Gateway (envoyproxy/gateway, internal/xds/translator/httpfilters.go,
  newOrderedHTTPFilter and sortHTTPFilters, read at d32f282, 2026-08-21): buffer (order 12)
  sorts before wasm (200 + index), router last; ``EnvoyProxy.spec.filterOrder`` then moves
  filters (``after``: behind the last filter of that type). wasm.go: one HCM filter
  ``envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<name>/wasm/<i>``, ``disabled: true``,
  enabled on the route with an empty ``FilterConfig``; vm_id is that same
  ``envoyextensionpolicy/<ns>/<name>/wasm/<i>``; ``failOpen`` becomes ``fail_open``.
  request_buffer.go: ``envoy.filters.http.buffer`` disabled on the HCM, enabled on the route by
  a ``BufferPerRoute`` with ``max_request_bytes`` = requestBuffer.limit.
* Envoy AI Gateway (envoyproxy/ai-gateway, internal/extensionserver/post_translate_modify.go,
  read at c217da8, 2026-08-21; the same in v1.1.0): after Envoy Gateway's ordering,
  insertAIGatewayExtProcFilter puts ``envoy.filters.http.ext_proc/aigateway`` (request body
  BUFFERED, ``disabled: true``, enabled on the AIGatewayRoute's routes) right before the first
  ext_proc, wasm, lua, rbac, local_ratelimit, ratelimit, custom_response, credential_injector,
  compressor or router filter (afterExtProcFilterPrefixes), or right after the last buffer
  filter when one sits at or after that place. Its per-backend upstream ext_proc (request
  headers only) goes among the cluster's upstream HTTP filters before upstream_codec; it
  replaces the body with the router-level copy when it rebuilds the request
  (internal/extproc/processor_impl.go, wantBodyReplace).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from tests.harness.envoy import load_shipped, render

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
# The header each agent sends with every request of a session, one value all session long
# (Claude Code, Codex CLI, OpenCode): the layouts that keep a session on one replica hash on
# them, in this order.
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id")
HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager")


def manifest_docs(rel: str) -> List[dict]:
    return [d for d in yaml.safe_load_all((KUBE / rel).read_text()) if d]


def manifest(rel: str, kind: str) -> dict:
    found = [d for d in manifest_docs(rel) if d.get("kind") == kind]
    assert len(found) == 1, f"{rel}: expected one {kind}, found {len(found)}"
    return found[0]


def quantity(q) -> int:
    if isinstance(q, int):
        return q
    m = re.fullmatch(r"([0-9]+)([KMGTPE]i|[kMGTPE])?", str(q))
    assert m, f"not a quantity: {q!r}"
    mult = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(m.group(1)) * mult[m.group(2) or ""]


def _typed(type_name: str, **fields) -> dict:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router")}


def _listener(port: int, buffer_limit: int, http_filters: List[dict], route: dict,
              stat_prefix: str) -> dict:
    return {
        "name": "gateway",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": HCM_TYPE,
                "stat_prefix": stat_prefix,
                "codec_type": "AUTO",
                "route_config": {"name": "gateway", "virtual_hosts": [
                    {"name": "llm", "domains": ["*"], "routes": [route]}]},
                "http_filters": http_filters,
            },
        }]}],
    }


def _cluster(name: str, upstream) -> dict:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": upstream[0], "port_value": upstream[1]}}}}]}]},
    }


def _bootstrap(admin_port: int, listener: dict, cluster: dict, node=None) -> dict:
    return {
        **({"node": node} if node else {}),
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {"listeners": [listener], "clusters": [cluster]},
    }


# ------------------------------------------------------------------------------------------
# Plain Envoy


def plain(*, wasm_path: str, listen_port: int, admin_port: int, upstream, workdir: Path,
          overrides: dict) -> dict:
    """envoy/envoy.yaml as shipped (incontext, buffer, router)."""
    shipped = load_shipped()
    wf = next(f for f in shipped["static_resources"]["listeners"][0]["filter_chains"][0]
              ["filters"][0]["typed_config"]["http_filters"]
              if f["name"] == "envoy.filters.http.wasm")
    pc = json.loads(wf["typed_config"]["config"]["configuration"]["value"])
    pc.update(overrides)
    return render(wasm_path=wasm_path, listen_port=listen_port, admin_port=admin_port,
                  upstream=upstream, plugin_config=pc)


# ------------------------------------------------------------------------------------------
# Istio


ISTIO_PHASES = {"AUTHN": 1, "AUTHZ": 2, "STATS": 3, None: 4}


def istio_http_filters(wasm_filter: dict, phase: Optional[str]) -> List[dict]:
    """buildHTTPConnectionManager's order for a gateway without authn/authz policies, with
    the Wasm filter at its phase."""
    slots: Dict[object, List[dict]] = {p: [] for p in ISTIO_PHASES}
    slots[phase].append(wasm_filter)
    filters: List[dict] = []
    # CUSTOM ext_authz: none; AUTHN slot; authn filters: none; AUTHZ slot; RBAC: none;
    # STATS slot; unspecified slot.
    for p in ("AUTHN", "AUTHZ", "STATS", None):
        filters += slots[p]
    filters.append({"name": "envoy.filters.http.grpc_stats", "typed_config": _typed(
        "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig", emit_filter_state=True,
        stats_for_all_methods=False)})
    # istio.alpn: Istio's own filter (not in upstream Envoy); sets ALPN for mTLS only.
    filters.append({"name": "envoy.filters.http.fault",
                    "typed_config": _typed("envoy.extensions.filters.http.fault.v3.HTTPFault")})
    filters.append({"name": "envoy.filters.http.cors",
                    "typed_config": _typed("envoy.extensions.filters.http.cors.v3.Cors")})
    # istio.stats: Istio's own telemetry filter (not in upstream Envoy); observes only.
    filters.append(copy.deepcopy(ROUTER))
    return filters


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict) and "@type" not in v:
            _merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


def apply_envoy_filter(filters: List[dict], routes: List[dict], envoy_filter: dict) -> \
        List[dict]:
    """An EnvoyFilter's GATEWAY patches as istiod applies them to the gateway's HCM: HTTP_FILTER
    INSERT_FIRST, or INSERT_BEFORE / INSERT_AFTER a named sub-filter, and HTTP_ROUTE MERGE into the routes of
    that name (``routes`` is changed in place). Other patch kinds are not modelled here."""
    out = list(filters)
    for cp in envoy_filter["spec"]["configPatches"]:
        if cp["applyTo"] == "LISTENER":
            continue   # listener settings (buffer-limit.yaml) are applied by the caller
        assert cp["match"]["context"] in ("GATEWAY", "ANY"), cp["match"]
        op = cp["patch"]["operation"]
        value = copy.deepcopy(cp["patch"]["value"])
        if cp["applyTo"] == "HTTP_FILTER" and op == "INSERT_FIRST":
            out.insert(0, value)
        elif cp["applyTo"] == "HTTP_FILTER":
            sub = cp["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            idx = [i for i, f in enumerate(out) if f["name"] == sub]
            assert idx, f"EnvoyFilter matches no HTTP filter named {sub!r}"
            if op == "INSERT_BEFORE":
                out.insert(idx[0], value)
            elif op == "INSERT_AFTER":
                out.insert(idx[0] + 1, value)
            else:
                raise AssertionError(f"HTTP_FILTER operation {op} not modelled")
        elif cp["applyTo"] == "HTTP_ROUTE":
            assert op == "MERGE", f"HTTP_ROUTE operation {op} not modelled"
            name = cp["match"]["routeConfiguration"]["vhost"]["route"]["name"]
            hits = [r for r in routes if r.get("name") == name]
            assert hits, f"EnvoyFilter matches no route named {name!r}"
            for r in hits:
                _merge(r, value)
        else:
            raise AssertionError(f"applyTo {cp['applyTo']} not modelled")
    return out


def istio(*, wasm_path: str, listen_port: int, admin_port: int, upstream, workdir: Path,
          overrides: dict, phase: Optional[str] = "manifest",
          envoy_filters: List[dict] = ()) -> dict:
    """The WasmPlugin (istio/wasmplugin.yaml) on the ingress gateway of routing.yaml, with the
    listener limit of buffer-limit.yaml and the given EnvoyFilters' patches."""
    wp = manifest("istio/wasmplugin.yaml", "WasmPlugin")
    spec, meta = wp["spec"], wp["metadata"]
    te_name = f"{meta['name']}~istio-translated-wasmplugin"
    filter_name = f"extensions.istio.io/trafficextension/{meta['namespace']}.{te_name}"
    pc = copy.deepcopy(spec["pluginConfig"])
    pc.update(overrides)
    failure = {"FAIL_OPEN": "FAIL_OPEN", "FAIL_CLOSE": "FAIL_CLOSED",
               "FAIL_RELOAD": "FAIL_RELOAD"}[spec.get("failStrategy", "FAIL_CLOSE")]
    wasm_config = {
        "@type": WASM_TYPE,
        "config": {
            "name": f"{meta['namespace']}.{te_name}",
            "root_id": spec.get("pluginName", ""),
            "configuration": _typed("google.protobuf.StringValue", value=json.dumps(pc)),
            "failure_policy": failure,
            # istio-agent has fetched the image and rewritten the remote code to a local file.
            "vm_config": {"runtime": "envoy.wasm.runtime.v8",
                          "code": {"local": {"filename": wasm_path}}},
        },
    }
    ecds = Path(workdir) / f"ecds-{listen_port}.yaml"
    ecds.write_text(yaml.safe_dump({
        "version_info": "1",
        "resources": [_typed("envoy.config.core.v3.TypedExtensionConfig", name=filter_name,
                             typed_config=wasm_config)],
    }, sort_keys=False))
    wasm_filter = {
        "name": filter_name,
        "config_discovery": {
            "config_source": {"path_config_source": {"path": str(ecds)},
                              "resource_api_version": "V3", "initial_fetch_timeout": "0s"},
            "type_urls": [WASM_TYPE,
                          "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"],
        },
    }
    phase = spec.get("phase") if phase == "manifest" else phase
    http_filters = istio_http_filters(wasm_filter, phase)
    cluster = pc["tokenizer"]["cluster"]   # outbound|8000||vllm.llm.svc.cluster.local
    limit = next(cp["patch"]["value"]["per_connection_buffer_limit_bytes"]
                 for cp in manifest("istio/buffer-limit.yaml", "EnvoyFilter")["spec"]
                 ["configPatches"] if cp["applyTo"] == "LISTENER")
    # The VirtualService's route: Envoy's route name is the http route's name (route.go,
    # TranslateRoute); Istio leaves the route timeout at 0 (none).
    http = manifest("istio/routing.yaml", "VirtualService")["spec"]["http"][0]
    route = {"name": http.get("name", ""),
             "match": {"prefix": http["match"][0]["uri"]["prefix"]},
             "route": {"cluster": cluster, "timeout": "0s"}}
    for ef in envoy_filters:
        http_filters = apply_envoy_filter(http_filters, [route], ef)
    # A file-based ECDS subscription wants a node id and cluster, as istio-agent gives them.
    node = {"id": "router~127.0.0.1~istio-ingressgateway.istio-system~istio-system.svc.cluster.local",
            "cluster": "istio-ingressgateway.istio-system"}
    return _bootstrap(admin_port, _listener(listen_port, limit, http_filters, route, "istio"),
                      _cluster(cluster, upstream), node)


# ------------------------------------------------------------------------------------------
# Envoy Gateway

# newOrderedHTTPFilter's orders for the filter types that occur here.
EG_ORDER = {"envoy.filters.http.buffer": 12, "envoy.filters.http.wasm": 200,
            "envoy.filters.http.router": 310}


def _eg_type(name: str) -> str:
    return name.split("/", 1)[0]


def eg_sort(filters: List[dict], filter_order: List[dict]) -> List[dict]:
    """sortHTTPFilters: the default order (ties by name), then each filterOrder entry."""
    out = sorted(filters, key=lambda f: (EG_ORDER.get(_eg_type(f["name"]), 50), f["name"]))
    for pos in filter_order:
        moving = [f for f in out if _eg_type(f["name"]) == pos["name"]]
        if not moving:
            continue
        rest = [f for f in out if _eg_type(f["name"]) != pos["name"]]
        if "before" in pos:
            at = next((i for i, f in enumerate(rest) if _eg_type(f["name"]) == pos["before"]),
                      None)
        else:
            hits = [i for i, f in enumerate(rest) if _eg_type(f["name"]) == pos["after"]]
            at = hits[-1] + 1 if hits else None
        if at is None:
            continue
        out = rest[:at] + moving + rest[at:]
    return out


def eg_http_filters(eep_rel: str, wasm_path: str, overrides: dict,
                    request_buffer: Optional[dict], filter_order: List[dict]):
    """The HCM filters and per-route configs Envoy Gateway makes for the EnvoyExtensionPolicy
    in ``eep_rel``; returns (http_filters, typed_per_filter_config, plugin configuration)."""
    eep = manifest(eep_rel, "EnvoyExtensionPolicy")
    meta = eep["metadata"]
    w = eep["spec"]["wasm"][0]
    ir_name = f"envoyextensionpolicy/{meta['namespace']}/{meta['name']}/wasm/0"
    pc = copy.deepcopy(w["config"])
    pc.update(overrides)
    plugin = {
        "name": w.get("name", ir_name),
        "configuration": _typed("google.protobuf.StringValue", value=json.dumps(pc)),
        "fail_open": bool(w.get("failOpen", False)),
        "vm_config": {"vm_id": ir_name, "runtime": "envoy.wasm.runtime.v8",
                      "code": {"local": {"filename": wasm_path}}},
    }
    if w.get("rootID"):
        plugin["root_id"] = w["rootID"]
    wasm_name = f"envoy.filters.http.wasm/{ir_name}"
    filters = [{"name": wasm_name, "disabled": True,
                "typed_config": {"@type": WASM_TYPE, "config": plugin}},
               copy.deepcopy(ROUTER)]
    per_route = {wasm_name: _typed("envoy.config.route.v3.FilterConfig", config={})}
    if request_buffer is not None:
        limit = quantity(request_buffer["limit"])
        filters.append({"name": "envoy.filters.http.buffer", "disabled": True,
                        "typed_config": _typed("envoy.extensions.filters.http.buffer.v3.Buffer",
                                               max_request_bytes=limit)})
        per_route["envoy.filters.http.buffer"] = _typed(
            "envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
            buffer={"max_request_bytes": limit})
    return eg_sort(filters, list(filter_order)), per_route, pc


def envoy_gateway(*, wasm_path: str, listen_port: int, admin_port: int, upstream,
                  workdir: Path, overrides: dict, request_buffer: Optional[dict] = None,
                  filter_order: List[dict] = ()) -> dict:
    """``request_buffer``: a BackendTrafficPolicy ``spec.requestBuffer``; ``filter_order``:
    an EnvoyProxy ``spec.filterOrder``."""
    http_filters, per_route, pc = eg_http_filters(
        "envoy-gateway/extension-policy.yaml", wasm_path, overrides, request_buffer,
        filter_order)
    cluster = pc["tokenizer"]["cluster"]   # httproute/llm/vllm/rule/0
    ctp = manifest("envoy-gateway/client-traffic-policy.yaml", "ClientTrafficPolicy")
    limit = quantity(ctp["spec"]["connection"]["bufferLimit"])
    rule = manifest("envoy-gateway/gateway.yaml", "HTTPRoute")["spec"]["rules"][0]
    route = {"match": {"prefix": rule["matches"][0]["path"]["value"]},
             "route": {"cluster": cluster, "timeout": rule["timeouts"]["request"]},
             "typed_per_filter_config": per_route}
    return _bootstrap(admin_port, _listener(listen_port, limit, http_filters, route, "eg"),
                      _cluster(cluster, upstream))


# ------------------------------------------------------------------------------------------
# Envoy AI Gateway

AIGW_EXTPROC = "envoy.filters.http.ext_proc/aigateway"
EXTPROC_TYPE = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
# afterExtProcFilterPrefixes: the AI Gateway's ext_proc goes right before the first of these.
AIGW_BEFORE = ("envoy.filters.http.ext_proc", "envoy.filters.http.wasm", "envoy.filters.http.lua",
               "envoy.filters.http.rbac", "envoy.filters.http.local_ratelimit",
               "envoy.filters.http.ratelimit", "envoy.filters.http.custom_response",
               "envoy.filters.http.credential_injector", "envoy.filters.http.compressor",
               "envoy.filters.http.router")


def ai_gateway_insert(filters: List[dict], extproc: dict) -> List[dict]:
    """insertAIGatewayExtProcFilter: before the first filter named with a prefix of
    AIGW_BEFORE, or right after the last buffer filter when one sits at or after that place."""
    at = next(i for i, f in enumerate(filters) if f["name"].startswith(AIGW_BEFORE))
    buffers = [i for i, f in enumerate(filters) if f["name"].startswith("envoy.filters.http.buffer")]
    if buffers and buffers[-1] >= at:
        at = buffers[-1] + 1
    return filters[:at] + [extproc] + filters[at:]


def _h2_cluster(name: str, addr) -> dict:
    c = _cluster(name, addr)
    c["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            explicit_http_config={"http2_protocol_options": {}})}
    return c


def ai_gateway(*, wasm_path: str, listen_port: int, admin_port: int, upstream, workdir: Path,
               overrides: dict, router_extproc, upstream_extproc,
               request_buffer: Optional[dict] = None, filter_order: List[dict] = ()) -> dict:
    """The Gateway of envoy-gateway/gateway.yaml with the AI Gateway's extension server applied
    to the route of ai-gateway/route.yaml and incontext from ai-gateway/extension-policy.yaml.

    Envoy Gateway orders its filters first (``request_buffer`` and ``filter_order`` as in
    ``envoy_gateway``); then the AI Gateway inserts its router-level ext_proc
    (``ai_gateway_insert``, disabled on the listener, enabled on its route), and puts its
    upstream ext_proc among the backend cluster's upstream HTTP filters, before the upstream
    codec. ``router_extproc`` / ``upstream_extproc``: (host, port) of the two processors
    (tests.harness.extproc; the AI Gateway serves both from one process). One route: the first
    AIGatewayRoute rule's backend; every tokenizer cluster of the configuration goes to
    ``upstream`` too. Left out: the AI Gateway's header-mutation filter after its upstream
    ext_proc (it restamps Content-Length on a rebuilt body)."""
    http_filters, per_route, pc = eg_http_filters(
        "ai-gateway/extension-policy.yaml", wasm_path, overrides, request_buffer, filter_order)
    router_cfg = _typed(
        EXTPROC_TYPE,
        grpc_service={"envoy_grpc": {"cluster_name": "ai-gateway-extproc-uds"}},
        processing_mode={"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                         "request_trailer_mode": "SKIP", "response_header_mode": "SKIP",
                         "response_body_mode": "NONE", "response_trailer_mode": "SKIP"},
        message_timeout="10s", failure_mode_allow=False, allow_mode_override=True)
    http_filters = ai_gateway_insert(
        http_filters, {"name": AIGW_EXTPROC, "disabled": True, "typed_config": router_cfg})
    per_route[AIGW_EXTPROC] = _typed("envoy.config.route.v3.FilterConfig", config={})
    upstream_cfg = _typed(
        EXTPROC_TYPE,
        grpc_service={"envoy_grpc": {"cluster_name": "ai-gateway-extproc-upstream"}},
        processing_mode={"request_header_mode": "SEND", "request_body_mode": "NONE",
                         "response_header_mode": "SKIP", "response_body_mode": "NONE"},
        message_timeout="10s", allow_mode_override=True)
    backend = _cluster("httproute/llm/models/rule/0", upstream)
    backend["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            explicit_http_config={"http_protocol_options": {}},
            http_filters=[
                {"name": AIGW_EXTPROC, "typed_config": upstream_cfg},
                {"name": "envoy.filters.http.upstream_codec", "typed_config": _typed(
                    "envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec")}])}
    clusters = [backend, _h2_cluster("ai-gateway-extproc-uds", router_extproc),
                _h2_cluster("ai-gateway-extproc-upstream", upstream_extproc)]
    for r in pc.get("routes", []):
        clusters.append(_cluster(r["tokenizer"]["cluster"], upstream))
    ctp = manifest("envoy-gateway/client-traffic-policy.yaml", "ClientTrafficPolicy")
    limit = quantity(ctp["spec"]["connection"]["bufferLimit"])
    route = {"match": {"prefix": "/"},
             "route": {"cluster": backend["name"], "timeout": "60s"},
             "typed_per_filter_config": per_route}
    boot = _bootstrap(admin_port, _listener(listen_port, limit, http_filters, route, "aigw"),
                      clusters[0])
    boot["static_resources"]["clusters"] = clusters
    return boot


def _http_filters(bootstrap: dict) -> List[dict]:
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return hcm["typed_config"]["http_filters"]


def filter_names(bootstrap: dict) -> List[str]:
    return [f["name"] for f in _http_filters(bootstrap)]


def is_wasm(f: dict) -> bool:
    return (f.get("typed_config", {}).get("@type") == WASM_TYPE
            or WASM_TYPE in f.get("config_discovery", {}).get("type_urls", []))


def remove_wasm(bootstrap: dict) -> None:
    """Drops the Wasm filter (INCONTEXT_E2E_NO_FILTER): the layout tests must then fail."""
    filters = _http_filters(bootstrap)
    filters[:] = [f for f in filters if not is_wasm(f)]
