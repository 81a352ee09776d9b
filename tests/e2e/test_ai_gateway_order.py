"""Envoy AI Gateway: which body its processor reads and which body the model server gets, in
each order of incontext and the AI Gateway's router-level ext_proc.

A real Envoy runs the HTTP filter chain Envoy Gateway and the AI Gateway's extension server
build for deploy/kubernetes/ai-gateway (tests/harness/layouts.py ``ai_gateway``: the AI
Gateway inserts ``envoy.filters.http.ext_proc/aigateway``, BUFFERED request body, before the
first Wasm filter, or right after the last buffer filter when one comes after that place), with
the AI Gateway's second ext_proc among the backend cluster's upstream HTTP filters. Both
processors are scripted (tests/harness/extproc.py): the router-level one keeps the body it
reads; the upstream one, when it rebuilds the request, replaces the body with that copy.
The recording upstream (tests/harness/recorder.py) is the model server and answers
incontext's /tokenize.

* With the buffer filter moved after Wasm (envoy-gateway/hold-request.yaml's EnvoyProxy
  filterOrder, and ai-gateway/hold-request.yaml's requestBuffer on the AI Gateway's HTTPRoute
  ``models``) the chain is incontext,
  buffer, the AI Gateway's ext_proc, router: the ext_proc reads the rewritten cap, and the
  model server gets it, also when the upstream filter rebuilds the request from the
  ext_proc's copy.
* Without it the chain is the AI Gateway's ext_proc, incontext, router: the ext_proc reads the
  client's cap; when the upstream filter rebuilds the request the model server gets the
  client's body byte for byte (incontext's rewrite is lost); when it does not, the model
  server gets incontext's rewrite.

Run: .venv/bin/python -m pytest tests/e2e/test_ai_gateway_order.py
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.common import nonce
from tests.harness import layouts, spec
from tests.harness.envoy import WASM, Envoy, no_filter
from tests.harness.extproc import RouterProcessor, UpstreamProcessor
from tests.harness.recorder import DEFAULT_MAX_MODEL_LEN, RecordingUpstream

PATH = "/v1/chat/completions"
EEP = layouts.manifest("ai-gateway/extension-policy.yaml", "EnvoyExtensionPolicy")
PC = EEP["spec"]["wasm"][0]["config"]
MODEL = PC["routes"][0]["model"]          # the coder model: the top-level policy applies
COUNT = 100
CLIENT_CAP = 100000                       # more than the window leaves

HOLD_BTP = layouts.manifest("ai-gateway/hold-request.yaml", "BackendTrafficPolicy")
HOLD_EG_PROXY = layouts.manifest("envoy-gateway/hold-request.yaml", "EnvoyProxy")

# Envoy AI Gateway loads the wasm build (an EnvoyExtensionPolicy): these tests run it only
# (tests/e2e/README.md).
pytestmark = pytest.mark.glues("wasm")

WASM_NAME = "envoy.filters.http.wasm/envoyextensionpolicy/llm/incontext-ai-gateway/wasm/0"
LAYOUTS = {
    "ai-gateway-with-hold-request": (
        {"request_buffer": HOLD_BTP["spec"]["requestBuffer"],
         "filter_order": HOLD_EG_PROXY["spec"]["filterOrder"]},
        [WASM_NAME, "envoy.filters.http.buffer", layouts.AIGW_EXTPROC,
         "envoy.filters.http.router"]),
    "ai-gateway": (
        {},
        [layouts.AIGW_EXTPROC, WASM_NAME, "envoy.filters.http.router"]),
}


class AIGatewayEnvoy(Envoy):
    """Envoy started from the AI Gateway layout's bootstrap."""

    def __init__(self, binary: str, workdir: Path, name: str, upstream, router, up, **kw):
        super().__init__(binary, workdir, {}, (upstream.host, upstream.port), name=name)
        self.cfg = layouts.ai_gateway(
            wasm_path=str(WASM), listen_port=self.port, admin_port=self.admin_port,
            upstream=(upstream.host, upstream.port), workdir=self.workdir, overrides={},
            router_extproc=(router.host, router.port), upstream_extproc=(up.host, up.port),
            **kw)
        if no_filter():
            layouts.remove_wasm(self.cfg)
        self.config_path.write_text(yaml.safe_dump(self.cfg, sort_keys=False))


@pytest.fixture(scope="module", params=list(LAYOUTS))
def gw(request, envoy_bin, glue, tmp_path_factory):
    name = request.param
    kw, _ = LAYOUTS[name]
    rec = RecordingUpstream().start()
    router = RouterProcessor().start()
    up = UpstreamProcessor(router).start()
    env = AIGatewayEnvoy(envoy_bin, tmp_path_factory.mktemp("aigw"), name.replace("-", "_"),
                         rec, router, up, **kw)
    env.start()
    try:
        yield name, env, rec, router, up
    finally:
        env.stop()
        up.stop()
        router.stop()
        rec.stop()


@pytest.fixture(autouse=True)
def _fresh(request):
    if "gw" in request.fixturenames:
        _, _, rec, router, up = request.getfixturevalue("gw")
        rec.reset()
        router.reset()
        up.reset()
    yield


def client_body() -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": CLIENT_CAP, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"hello {nonce()}"}]}, indent=1).encode()


def incontext_cap(sent: bytes) -> int:
    """The cap incontext writes for ``sent`` (docs/spec.md; computed, not copied)."""
    d = spec.decide(json.loads(sent), COUNT, True, W=DEFAULT_MAX_MODEL_LEN,
                    C=DEFAULT_MAX_MODEL_LEN, R=PC["min_output_tokens"],
                    F=PC["fallback_margin_tokens"])
    assert d.rewrite and d.field == "max_tokens" and d.value < CLIENT_CAP
    return d.value


def send(env: Envoy, rec: RecordingUpstream, up: UpstreamProcessor, rebuild: bool):
    """One request: (what the client sent, the response, the bodies the AI Gateway's
    router-level ext_proc read, the bodies the model server got)."""
    rec.tokenizer.set(COUNT)
    up.rebuild = rebuild
    sent = client_body()
    r = httpx.post(env.url + PATH, content=sent, timeout=60,
                   headers={"content-type": "application/json"})
    return sent, r


def without_cap(raw: bytes) -> dict:
    obj = json.loads(raw)
    obj.pop("max_tokens", None)
    return obj


def test_the_chain_is_the_one_the_ai_gateway_builds(gw):
    name, env, *_ = gw
    assert layouts.filter_names(env.cfg) == LAYOUTS[name][1]


@pytest.mark.parametrize("rebuild", [True, False], ids=["upstream-rebuilds", "upstream-keeps"])
def test_which_cap_the_ai_gateway_reads_and_the_model_server_gets(gw, rebuild):
    name, env, rec, router, up = gw
    sent, r = send(env, rec, up, rebuild)
    assert r.status_code == 200, r.text
    assert r.headers.get("x-incontext-action") == "rewritten"
    assert len(rec.tokenize_calls()) == 1
    read = router.bodies()
    fwd = rec.forwarded()
    assert len(read) == 1, f"the AI Gateway's ext_proc read {len(read)} bodies"
    assert len(fwd) == 1 and fwd[0].complete
    assert up.replaced == [rebuild], "the upstream ext_proc did not see the request once"
    # Every request reached the model server with the model the AI Gateway routes on.
    assert fwd[0].header("x-ai-eg-model") == MODEL
    cap = incontext_cap(sent)
    got = json.loads(fwd[0].body)
    if name == "ai-gateway-with-hold-request":
        # incontext first: the AI Gateway reads the rewritten body and keeps it.
        assert json.loads(read[0])["max_tokens"] == cap
        assert without_cap(read[0]) == without_cap(sent)
        assert fwd[0].body == read[0]
        assert got["max_tokens"] == cap
    else:
        # The AI Gateway first: it reads the client's body.
        assert read[0] == sent
        if rebuild:
            # The upstream filter rebuilds from that copy: incontext's rewrite is lost.
            assert fwd[0].body == sent
            assert got["max_tokens"] == CLIENT_CAP
        else:
            # No rebuild: the body incontext wrote after the ext_proc goes upstream.
            assert got["max_tokens"] == cap
            assert without_cap(fwd[0].body) == without_cap(sent)
    assert fwd[0].transfer_encoding is None or fwd[0].content_length is None
    if fwd[0].content_length is not None:
        assert fwd[0].content_length == str(len(fwd[0].body))


def test_hold_policy_enables_the_buffer_on_incontexts_route():
    """ai-gateway/hold-request.yaml enables the buffer filter on the route incontext runs on,
    with room for every body incontext reads."""
    assert HOLD_BTP["spec"]["targetRefs"] == EEP["spec"]["targetRefs"], HOLD_BTP["spec"]
    assert HOLD_BTP["metadata"]["namespace"] == EEP["metadata"]["namespace"]
    limit = layouts.quantity(HOLD_BTP["spec"]["requestBuffer"]["limit"])
    assert limit >= PC["max_body_bytes"], (limit, PC["max_body_bytes"])
