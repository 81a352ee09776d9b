"""No request reaches the upstream before incontext has decided, in every shipped layout.

Each layout is a real Envoy running the HTTP filter chain that layout produces
(tests/harness/layouts.py says where each order comes from) in front of a recording upstream
(tests/harness/recorder.py) that also answers the filter's /tokenize calls. For each layout:

* a rejected request (``on_insufficient: reject``, a prompt that leaves no room) opens no
  upstream request: no request headers reach the upstream;
* a request whose count takes 2 s has no upstream request open meanwhile: its headers reach the
  upstream only after the tokenizer answered;
* an unchanged body (a completion request without a cap, which the filter can only tell from
  the body) arrives with its original Content-Length, not chunked;
* a rewritten body arrives with a Content-Length equal to its length, not chunked, also when
  the client sent it chunked;
* an upstream that answers as soon as it has the headers still gets the whole rewritten body,
  and the tokenizer's answer is cached: the same request again calls the tokenizer no more.

The native module's layout is envoy/envoy-module.yaml (the module holds the request itself, no
buffer filter): it runs as `module-plain-envoy` with the same checks. The gateway layouts load
the wasm build only (Istio and Envoy Gateway pull it as an OCI image): they run as `wasm-*`.

What the upstream saw is written, per layout and check, to the JSON file named by
``INCONTEXT_LAYOUTS_REPORT`` (if set).

Run: .venv/bin/python -m pytest tests/e2e/test_layouts.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.common import nonce
from tests.harness import layouts
from tests.harness.envoy import (ARTIFACT, BUILD, MODULE_FILTER, WASM, Envoy, glues, load_shipped,
                                 no_filter, render)
from tests.harness.recorder import DEFAULT_MAX_MODEL_LEN, RecordingUpstream

PATH = "/v1/chat/completions"
MODEL = "test/model"
# The plugin configuration is the manifest's, with rejection on so that it can be observed.
OVERRIDES = {"on_insufficient": "reject"}
SLOW = 2.0

HOLD_ISTIO = layouts.manifest("istio/hold-request.yaml", "EnvoyFilter")
HOLD_EG_BTP = layouts.manifest("envoy-gateway/hold-request.yaml", "BackendTrafficPolicy")
HOLD_EG_PROXY = layouts.manifest("envoy-gateway/hold-request.yaml", "EnvoyProxy")



def plain_module(*, wasm_path: str, listen_port: int, admin_port: int, upstream, workdir: Path,
                 overrides: dict) -> dict:
    """envoy/envoy-module.yaml as shipped (the module, router)."""
    shipped = load_shipped("module")
    mf = next(f for f in shipped["static_resources"]["listeners"][0]["filter_chains"][0]
              ["filters"][0]["typed_config"]["http_filters"] if f["name"] == MODULE_FILTER)
    pc = {**json.loads(mf["typed_config"]["filter_config"]["value"]), **overrides}
    return render(wasm_path=wasm_path, listen_port=listen_port, admin_port=admin_port,
                  upstream=upstream, plugin_config=pc, glue="module")


# The shipped layouts, by build: every check must pass.
SHIPPED = {
    "wasm-plain-envoy": (layouts.plain, {}),
    "wasm-istio": (layouts.istio, {"envoy_filters": [HOLD_ISTIO]}),
    "wasm-envoy-gateway": (layouts.envoy_gateway,
                           {"request_buffer": HOLD_EG_BTP["spec"]["requestBuffer"],
                            "filter_order": HOLD_EG_PROXY["spec"]["filterOrder"]}),
    "module-plain-envoy": (plain_module, {}),
}
# The builds INCONTEXT_E2E_GLUES names.
RUN = [n for n in SHIPPED if n.split("-", 1)[0] in glues()]
# The gateway layouts without the hold-request manifests (and Envoy Gateway's requestBuffer in
# its default place, before Wasm): the upstream sees the request before the decision. This is
# why the manifests exist, and it shows the checks above can fail.
UNHELD = {
    "istio-without-hold-request": (layouts.istio, {}),
    "envoy-gateway-without-hold-request": (layouts.envoy_gateway, {}),
    "envoy-gateway-requestBuffer-default-order": (
        layouts.envoy_gateway, {"request_buffer": HOLD_EG_BTP["spec"]["requestBuffer"]}),
}

REPORT: dict = {}


class LayoutEnvoy(Envoy):
    """Envoy started from a layout's bootstrap instead of the rendered envoy/envoy.yaml."""

    def __init__(self, binary: str, workdir: Path, name: str, glue: str, build, upstream, **kw):
        super().__init__(binary, workdir, {}, (upstream.host, upstream.port), name=name,
                         glue=glue)
        self.cfg = build(wasm_path=str(WASM), listen_port=self.port,
                         admin_port=self.admin_port, upstream=(upstream.host, upstream.port),
                         workdir=self.workdir, overrides=OVERRIDES, **kw)
        if no_filter():
            hcm = self.cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            filters = hcm["typed_config"]["http_filters"]
            filters[:] = [f for f in filters if f["name"] != MODULE_FILTER]
            layouts.remove_wasm(self.cfg)
        self.config_path.write_text(yaml.safe_dump(self.cfg, sort_keys=False))


def _run(request, envoy_bin, tmp_path_factory, table, glue):
    name = request.param
    build, kw = table[name]
    if not ARTIFACT[glue].is_file() and not no_filter():
        pytest.fail(f"{ARTIFACT[glue]} is missing: run `{BUILD[glue]}`", pytrace=False)
    rec = RecordingUpstream().start()
    env = LayoutEnvoy(envoy_bin, tmp_path_factory.mktemp("layouts"), name.replace("+", "_"),
                      glue, build, rec, **kw)
    REPORT.setdefault(report_key(name), {})["http_filters"] = layouts.filter_names(env.cfg)
    env.start()
    try:
        yield name, env, rec
    finally:
        env.stop()
        rec.stop()


@pytest.fixture(scope="module", params=RUN)
def layout(request, envoy_bin, tmp_path_factory):
    yield from _run(request, envoy_bin, tmp_path_factory, SHIPPED, request.param.split("-")[0])


@pytest.fixture(scope="module", params=list(UNHELD))
def unheld(request, glue, envoy_bin, tmp_path_factory):
    """The gateway layouts without hold-request: wasm only (its tests are marked so)."""
    yield from _run(request, envoy_bin, tmp_path_factory, UNHELD, glue)


@pytest.fixture(autouse=True)
def _fresh_recorder(request):
    for name in ("layout", "unheld"):
        if name in request.fixturenames:
            request.getfixturevalue(name)[2].reset()
    yield


def teardown_module(module):
    path = os.environ.get("INCONTEXT_LAYOUTS_REPORT")
    if path:
        Path(path).write_text(json.dumps(REPORT, indent=1, sort_keys=True))


def body(**extra) -> bytes:
    obj = {"model": MODEL, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"hello {nonce()}"}]}
    obj.update(extra)
    return json.dumps(obj, indent=1).encode()


def post(env: Envoy, data: bytes, path: str = PATH) -> httpx.Response:
    return httpx.post(env.url + path, content=data, timeout=60,
                      headers={"content-type": "application/json",
                               "authorization": "Bearer client-secret"})


def settle(rec: RecordingUpstream, seconds=0.5):
    """Give bytes Envoy may still be sending (a reset request) time to arrive."""
    time.sleep(seconds)


def exchanges_done(env: Envoy, rec: RecordingUpstream, completed_before: int,
                   timeout=10.0) -> bool:
    """Waits until every request the upstream received since it was reset (tokenizer calls
    included) has been answered and Envoy has completed as many upstream requests since
    ``completed_before`` (its ``upstream_completed()`` then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, reqs = rec.snapshot()
        done = env.upstream_completed() - completed_before
        if all(r.answered_at is not None for r in reqs) and done >= len(reqs):
            return True
        time.sleep(0.02)
    return False


def report_key(name: str) -> str:
    """A layout's name in the report: the wasm layouts by their own names (docs/gateways.md)."""
    return name.removeprefix("wasm-")


def note(name: str, check: str, **seen):
    REPORT.setdefault(report_key(name), {})[check] = seen


def forwarded_summary(rec, t0: float, answered: float | None):
    out = []
    for r in rec.forwarded():
        s = r.summary()
        s["headers_after_send_s"] = round(r.headers_at - t0, 3)
        if answered is not None:
            s["headers_minus_tokenizer_answer_s"] = round(r.headers_at - answered, 3)
        out.append(s)
    return out


def send_rejected(name, env, rec) -> dict:
    """A prompt that leaves no room, counted in 0.5 s: what the client and upstream saw."""
    rec.tokenizer.set(DEFAULT_MAX_MODEL_LEN - 100, delay=0.5)
    t0 = time.monotonic()
    r = post(env, body())
    settle(rec)
    calls = rec.tokenize_calls()
    answered = calls[0].answered_at if calls else None
    conns, _ = rec.snapshot()
    seen = {
        "status": r.status_code, "tokenizer_calls": len(calls),
        "upstream_connections": len(conns),
        "connections_carrying_the_request": sum(PATH.encode() in bytes(c.raw) for c in conns),
        "client_authorization_reached_upstream": any(
            f.header("authorization") for f in rec.forwarded()),
        "forwarded_request_connection_closed": [
            next(c.closed_at is not None for c in conns if c.id == f.conn)
            for f in rec.forwarded()],
        "forwarded": forwarded_summary(rec, t0, answered),
    }
    note(name, "rejected", **seen)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert len(calls) == 1
    return seen


def send_slow(name, env, rec) -> dict:
    """A request whose count takes SLOW seconds: when its headers reached the upstream."""
    rec.tokenizer.set(100, delay=SLOW)
    t0 = time.monotonic()
    r = post(env, body(max_tokens=50))
    elapsed = time.monotonic() - t0
    calls = rec.tokenize_calls()
    fwd = rec.forwarded()
    assert r.status_code == 200, r.text
    assert len(calls) == 1 and len(fwd) == 1
    answered = calls[0].answered_at
    conns, _ = rec.snapshot()
    seen = {
        "status": r.status_code, "elapsed_s": round(elapsed, 3), "tokenizer_calls": len(calls),
        "upstream_connections": len(conns),
        "bytes_on_other_connections_before_the_answer": {
            c.id: c.bytes_before(answered) for c in conns
            if c.id != calls[0].conn and c.bytes_before(answered)},
        "headers_before_the_answer_s": round(answered - fwd[0].headers_at, 3),
        "forwarded": forwarded_summary(rec, t0, answered),
    }
    note(name, "slow_tokenizer", **seen)
    assert elapsed >= SLOW
    return seen


def test_rejected_request_opens_no_upstream_request(layout):
    seen = send_rejected(*layout)
    assert seen["forwarded"] == [], "the rejected request's headers reached the upstream"
    assert seen["connections_carrying_the_request"] == 0


def test_no_upstream_request_while_the_tokenizer_runs(layout):
    seen = send_slow(*layout)
    assert seen["headers_before_the_answer_s"] <= 0, (
        f"the upstream had the request's headers {seen['headers_before_the_answer_s']} s "
        "before the tokenizer answered")
    early = seen["bytes_on_other_connections_before_the_answer"]
    assert early == {}, f"bytes reached other upstream connections before the decision: {early}"


@pytest.mark.glues("wasm")   # the gateways load the wasm build (tests/e2e/README.md)
def test_without_hold_request_the_upstream_sees_the_request_first(unheld):
    """Without the hold-request manifest (or with Envoy Gateway's buffer in its default place,
    before Wasm) the headers reach the upstream before incontext has decided."""
    rejected = send_rejected(*unheld)
    assert len(rejected["forwarded"]) == 1
    assert rejected["client_authorization_reached_upstream"]
    assert not rejected["forwarded"][0]["complete"], "a rejected request was sent whole"
    assert rejected["forwarded_request_connection_closed"] == [True], "no reset after the headers"
    unheld[2].reset()
    slow = send_slow(*unheld)
    assert slow["headers_before_the_answer_s"] >= SLOW * 0.75


def test_unchanged_body_keeps_its_content_length(layout):
    """A completion request without a cap passes unchanged (vLLM's own default applies); the
    filter only knows that once it has read the body."""
    name, env, rec = layout
    rec.tokenizer.set(100)
    sent = json.dumps({"model": MODEL, "prompt": f"once upon {nonce()}"}, indent=1).encode()
    r = post(env, sent, "/v1/completions")
    fwd = rec.forwarded()
    note(name, "unchanged", status=r.status_code,
         action=r.headers.get("x-incontext-action"), sent_len=len(sent),
         forwarded=[f.summary() for f in fwd])
    assert r.status_code == 200, r.text
    assert (r.headers.get("x-incontext-action") or "").startswith("unchanged")
    assert len(fwd) == 1
    assert fwd[0].body == sent
    assert fwd[0].transfer_encoding is None, "an unchanged body went upstream chunked"
    assert fwd[0].content_length == str(len(sent))


def test_rewritten_body_has_a_correct_content_length(layout):
    name, env, rec = layout
    rec.tokenizer.set(100)
    sent = body()
    r = post(env, sent)
    fwd = rec.forwarded()
    note(name, "rewritten", status=r.status_code,
         action=r.headers.get("x-incontext-action"), sent_len=len(sent),
         forwarded=[f.summary() for f in fwd])
    assert r.status_code == 200, r.text
    assert r.headers.get("x-incontext-action") == "rewritten"
    assert len(fwd) == 1
    got = fwd[0]
    assert got.body != sent and "max_tokens" in json.loads(got.body)
    assert got.transfer_encoding is None, "a rewritten body went upstream chunked"
    assert got.content_length == str(len(got.body))


def test_rewritten_chunked_body_has_a_correct_content_length(layout):
    """The client sends its body chunked (no Content-Length): the rewritten body still goes
    upstream with one framing, a Content-Length equal to its length."""
    name, env, rec = layout
    rec.tokenizer.set(100)
    sent = body()
    half = len(sent) // 2
    r = httpx.post(env.url + PATH, content=iter([sent[:half], sent[half:]]), timeout=60,
                   headers={"content-type": "application/json"})
    fwd = rec.forwarded()
    note(name, "rewritten_chunked", status=r.status_code,
         action=r.headers.get("x-incontext-action"), sent_len=len(sent),
         forwarded=[f.summary() for f in fwd])
    assert r.status_code == 200, r.text
    assert r.headers.get("x-incontext-action") == "rewritten"
    assert len(fwd) == 1
    got = fwd[0]
    assert got.body != sent and "max_tokens" in json.loads(got.body)
    assert got.transfer_encoding is None, "a rewritten body went upstream chunked"
    assert got.content_length == str(len(got.body))


def test_upstream_answering_on_headers_gets_the_decided_request(layout):
    """An upstream that answers as soon as it has the headers still gets the rewritten body,
    and the tokenizer's answer is cached: the same request again makes no second call."""
    name, env, rec = layout
    rec.tokenizer.set(100, delay=0.5)
    rec.answer_on_headers = True
    sent = body()
    completed = env.upstream_completed()
    first = post(env, sent)
    # the first tokenizer call has answered and Envoy has its answer: its count is cached or lost
    assert exchanges_done(env, rec, completed), "Envoy did not finish its upstream requests"
    second = post(env, sent)
    assert exchanges_done(env, rec, completed), "Envoy did not finish its upstream requests"
    calls = rec.tokenize_calls()
    fwd = rec.forwarded()
    note(name, "answer_on_headers", statuses=[first.status_code, second.status_code],
         tokenizer_calls=len(calls), forwarded=[f.summary() for f in fwd])
    assert first.status_code == 200 and second.status_code == 200
    assert len(fwd) == 2
    for f in fwd:
        assert f.complete, "the upstream got the headers but not the whole body"
        assert "max_tokens" in json.loads(f.body), "the upstream got the body before the rewrite"
    assert len(calls) == 1, f"two identical requests made {len(calls)} tokenizer calls"
