"""The security boundary.

* The tokenizer credential comes from the plugin configuration, from an environment variable of
  the Envoy process exposed to the VM (`vm_config.environment_variables.host_env_keys`), or from
  a variable Envoy's config sets for the VM (`environment_variables.key_values`); header values
  `{"env": "VAR"}` in `tokenizer.headers`. It is sent to the tokenizer and never logged. (The
  module reads every variable from Envoy's own environment: both are set there for it.)
* A missing or unusable variable makes Envoy refuse the configuration, with a log line naming
  the header, never a value.
* Client credentials (authorization, cookie, x-api-key, proxy-authorization) are never
  forwarded to the tokenizer; the upstream request keeps them.
* The canary: with wasm debug logs, the log never holds a credential or prompt text, whatever
  the outcome (rewritten, cache, estimate after a tokenizer error that echoes the prompt and the
  key, rejected, not JSON).
"""

from __future__ import annotations

import os
import re

import pytest

from tests.e2e.common import (Proxy, assert_rewritten, assert_unchanged, cfg, chat, dumps, nonce)
from tests.harness.envoy import DEBUG_LOG, Envoy, EnvoyError, no_filter, validate
from tests.harness.spec import estimate

RUN = nonce()
ENV_VAR = f"INCONTEXT_TEST_TOKEN_{RUN.upper()}"
KV_VAR = f"INCONTEXT_KV_TOKEN_{RUN.upper()}"
CFG_SECRET = f"Bearer cfg-secret-{RUN}"
ENV_SECRET = f"Bearer env-secret-{RUN}"
KV_SECRET = f"kv-secret-{RUN}"
CLIENT = {
    "authorization": f"Bearer client-auth-{RUN}",
    "cookie": f"session=client-cookie-{RUN}",
    "x-api-key": f"client-api-key-{RUN}",
    "proxy-authorization": f"Basic client-proxy-{RUN}",
}
PROMPT_CANARY = f"canary-prompt-{RUN}"
TOKENIZER_HEADERS = {
    "authorization": CFG_SECRET,
    "x-tokenizer-token": {"env": ENV_VAR},
    "x-kv-token": {"env": KV_VAR},
}
SECURE = cfg(tokenizer={"headers": TOKENIZER_HEADERS}, on_insufficient="reject")
SECRETS = [CFG_SECRET, ENV_SECRET, KV_SECRET, *CLIENT.values()]
# every value's distinctive part, so a partial leak (say, the token without "Bearer") shows too
SECRET_PARTS = [f"cfg-secret-{RUN}", f"env-secret-{RUN}", KV_SECRET, f"client-auth-{RUN}",
                f"client-cookie-{RUN}", f"client-api-key-{RUN}", f"client-proxy-{RUN}"]
# what the tokenizer call may carry: the filter's own headers, the configured ones, and what
# Envoy adds to every upstream request (no client header may appear)
ALLOWED_TOKENIZER_HEADERS = {"host", "content-type", "content-length", "user-agent",
                             "authorization", "x-tokenizer-token", "x-kv-token",
                             "x-envoy-expected-rq-timeout-ms", "x-request-id",
                             "x-forwarded-proto", "x-envoy-internal"}

assert ENV_VAR not in os.environ


@pytest.fixture(scope="module")
def senv(envoy_bin, glue, upstream, envoys):
    """Envoy with the tokenizer credential in the config, in the Envoy process environment
    (host_env_keys) and in key_values; the filter logs at debug."""
    env = Envoy(envoy_bin, envoys.workdir, SECURE, (upstream.host, upstream.port),
                remove_filter=no_filter(), name=f"envoy-security-{glue}",
                host_env_keys=[ENV_VAR], env_key_values={KV_VAR: KV_SECRET},
                env=process_env(glue, {ENV_VAR: ENV_SECRET}), glue=glue,
                log_args=("-l", "info", "--component-log-level", DEBUG_LOG[glue]))
    env.start()
    yield env
    env.stop()


def process_env(glue, env=None):
    """The Envoy process environment: the module reads the key_values variable there too."""
    return {**({KV_VAR: KV_SECRET} if glue == "module" else {}), **(env or {})}


@pytest.fixture
def sp(senv, upstream):
    p = Proxy(senv, upstream)
    yield p
    p.close()


def prompt(tag=""):
    return f"{PROMPT_CANARY} {tag} {nonce()}"


# Envoy's callouts for the module (its async client) add x-forwarded-for, Envoy's own address.
ALLOWED_FOR = {"wasm": ALLOWED_TOKENIZER_HEADERS,
               "module": ALLOWED_TOKENIZER_HEADERS | {"x-forwarded-for"}}


def check_tokenizer_call(call, glue):
    names = {k.lower() for k, _ in call.headers}
    allowed = ALLOWED_FOR[glue]
    assert names <= allowed, f"unexpected headers to the tokenizer: {names - allowed}"
    xff = call.header("x-forwarded-for")
    assert xff is None or re.fullmatch(r"[0-9a-fA-F.:]+", xff), "x-forwarded-for is no address"
    assert call.header_all("authorization") == [CFG_SECRET]
    assert call.header("x-tokenizer-token") == ENV_SECRET
    assert call.header("x-kv-token") == KV_SECRET
    for k in ("cookie", "x-api-key", "proxy-authorization"):
        assert call.header(k) is None, f"client {k} forwarded to the tokenizer"
    blob = repr(call.headers).encode() + call.body
    for value in CLIENT.values():
        assert value.encode() not in blob, "a client credential reached the tokenizer"


# --- credentials to the tokenizer ---------------------------------------------------------------
def test_tokenizer_credentials_from_config_env_and_key_values_are_sent(sp, upstream):
    upstream.tokenizer.count(100)
    res = sp.post(chat(prompt("sent"), max_tokens=100000))
    assert_rewritten(res, 100)
    assert len(res.tokenize) == 1
    check_tokenizer_call(res.tokenize[0], sp.envoy.glue)


@pytest.mark.parametrize("h2", [False, True], ids=["http1", "http2"])
def test_client_credentials_are_never_forwarded_to_the_tokenizer(sp, senv, upstream, h2):
    import httpx

    upstream.tokenizer.count(100)
    body = dumps(chat(prompt("client"), max_tokens=100000))
    headers = {"content-type": "application/json", **CLIENT}
    with httpx.Client(base_url=senv.url, http1=not h2, http2=h2, timeout=60) as client:
        before_up, before_tok = len(upstream.snapshot()), len(upstream.tokenizer.snapshot())
        r = client.post("/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == 200 and r.headers["x-incontext-action"] == "rewritten"
    calls = upstream.tokenizer.snapshot()[before_tok:]
    assert len(calls) == 1
    check_tokenizer_call(calls[0], senv.glue)
    # the request itself goes upstream with the client's credentials untouched
    (rec,) = upstream.snapshot()[before_up:]
    for k, v in CLIENT.items():
        assert rec.header(k) == v, k
    assert rec.header("x-tokenizer-token") is None and rec.header("x-kv-token") is None


def test_client_credentials_not_forwarded_when_tokenizer_fails(sp, upstream):
    """The tokenizer answers an error that echoes the client's and the filter's secrets and the
    prompt: the estimate is used and none of it goes anywhere else (see the log canary)."""
    text = prompt("failing")
    upstream.tokenizer.always(("raw", 401, (f'{{"error": "bad key {CFG_SECRET} {ENV_SECRET} '
                                            f'for prompt {text}"}}').encode(),
                               "application/json"))
    res = sp.post(chat(text, max_tokens=100000), headers=CLIENT)
    assert res.source == "estimate", res.describe()
    assert_rewritten(res, estimate(res.sent), exact=False)
    check_tokenizer_call(res.tokenize[0], sp.envoy.glue)


def test_env_credential_is_not_in_envoys_config_dump(senv):
    """The admin /config_dump shows the plugin configuration as written: a literal tokenizer
    header (and a key_values variable) is visible there, a host_env_keys one is not (it is read
    by the VM from Envoy's environment). Keep the admin interface on loopback either way."""
    from tests.harness.envoy import _http_get

    status, dump = _http_get(senv.admin + "/config_dump", timeout=10)
    assert status == 200
    assert ENV_VAR in dump and f"env-secret-{RUN}" not in dump
    assert f"cfg-secret-{RUN}" in dump  # literal in the config: visible to admin readers


# --- configuration refusals: the header is named, the value is not ---------------------------
def _refusal(envoy_bin, vdir, name, glue, *, env=None, host_env_keys=(ENV_VAR,)):
    rc, out = validate(envoy_bin, vdir, SECURE, name=name, host_env_keys=list(host_env_keys),
                       env_key_values={KV_VAR: KV_SECRET}, env=process_env(glue, env), glue=glue)
    return rc, out


def _assert_names_header_not_values(out: str):
    assert "tokenizer.headers.x-tokenizer-token" in out, out[-2000:]
    for part in SECRET_PARTS:
        assert part not in out, f"a credential ({part}) appears in Envoy's output"


def test_missing_env_variable_refuses_the_config(envoy_bin, glue, tmp_path):
    rc, out = _refusal(envoy_bin, tmp_path, "missing-env", glue)
    assert rc != 0, "Envoy accepted a config whose tokenizer header variable is not set"
    _assert_names_header_not_values(out)
    assert ENV_VAR in out  # the variable is named, so the operator knows what to set


@pytest.mark.glues("wasm")   # the VM's environment list (tests/e2e/README.md)
def test_env_variable_not_listed_in_host_env_keys_is_not_visible(envoy_bin, glue, tmp_path):
    """Set in Envoy's environment but not exposed to the VM: refused like a missing one (the VM
    sees only the variables host_env_keys lists)."""
    rc, out = _refusal(envoy_bin, tmp_path, "unlisted-env", glue, env={ENV_VAR: ENV_SECRET},
                       host_env_keys=())
    assert rc != 0
    _assert_names_header_not_values(out)


@pytest.mark.parametrize("value", [f"Bearer env-secret-{RUN}\x01", f"env-secret-{RUN}\nX: y", ""],
                         ids=["control_char", "newline", "empty"])
def test_unusable_env_variable_refuses_the_config(envoy_bin, glue, tmp_path, value):
    rc, out = _refusal(envoy_bin, tmp_path, "bad-env", glue, env={ENV_VAR: value})
    assert rc != 0, f"Envoy accepted tokenizer header value {value!r}"
    _assert_names_header_not_values(out)


def test_missing_env_variable_stops_a_real_envoy(envoy_bin, glue, upstream, tmp_path):
    env = Envoy(envoy_bin, tmp_path, SECURE, (upstream.host, upstream.port), name="missing",
                host_env_keys=[ENV_VAR], env_key_values={KV_VAR: KV_SECRET},
                env=process_env(glue), refusal_expected=True, glue=glue)
    with pytest.raises(EnvoyError):
        env.start(timeout=60)
    env.stop()
    _assert_names_header_not_values(env.log_text())


# --- TLS to the tokenizer through the Envoy cluster ---------------------------------------------
TLS_NAME = "tokenizer.internal"


def _openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A throwaway CA and a server certificate for tokenizer.internal (openssl CLI)."""
    import shutil

    if not shutil.which("openssl"):
        pytest.fail("the TLS test needs the openssl command", pytrace=False)
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=incontext test {ca}", cwd=d)
    _openssl("req", *ec, "-keyout", "tok.key", "-out", "tok.csr", "-subj", f"/CN={TLS_NAME}",
             cwd=d)
    (d / "ext").write_text(f"subjectAltName=DNS:{TLS_NAME}\n")
    _openssl("x509", "-req", "-in", "tok.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "tok.pem", "-days", "2", "-extfile", "ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_tokenizer(tls_files):
    """The fake tokenizer behind TLS only (a second Upstream whose socket speaks TLS)."""
    import ssl

    from tests.harness.upstream import Upstream

    up = Upstream()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls_files / "tok.pem", tls_files / "tok.key")
    up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True)
    up.start()
    yield up
    up.stop()


def tls_cluster(port: int, ca_file) -> dict:
    """The TLS cluster for the tokenizer (vLLM) that docs/deployment.md shows, with the test's port and CA."""
    return {
        "name": "vllm-tls", "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": "vllm-tls", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                         "port_value": port}}}}]}]},
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                         "UpstreamTlsContext",
                "sni": TLS_NAME,
                "common_tls_context": {"validation_context": {
                    "trusted_ca": {"filename": str(ca_file)},
                    "match_typed_subject_alt_names": [
                        {"san_type": "DNS", "matcher": {"exact": TLS_NAME}}]}}}},
    }


@pytest.mark.parametrize("ca,trusted", [("ca.pem", True), ("other-ca.pem", False)],
                         ids=["verified", "untrusted_certificate"])
def test_tokenizer_over_tls_through_the_envoy_cluster(envoy_bin, glue, upstream, tls_tokenizer,
                                                      tls_files, envoys, ca, trusted):
    """The filter's /tokenize call goes through an Envoy cluster with an UpstreamTlsContext: the
    prompt and the credential travel encrypted to a verified tokenizer. With a certificate the
    cluster does not trust, no call gets through: the estimate is used (fail-open)."""
    plugin = cfg(tokenizer={"cluster": "vllm-tls", "authority": f"{TLS_NAME}:8443",
                            "headers": {"authorization": CFG_SECRET}})
    env = Envoy(envoy_bin, envoys.workdir, plugin, (upstream.host, upstream.port),
                remove_filter=no_filter(), name=f"envoy-tls-{'ok' if trusted else 'bad'}-{glue}",
                extra_clusters=[tls_cluster(tls_tokenizer.port, tls_files / ca)], glue=glue)
    env.start()
    tls_tokenizer.reset()
    tls_tokenizer.tokenizer.count(1234)
    p = Proxy(env, upstream)
    try:
        res = p.post(chat(prompt("tls"), max_tokens=100000), headers=CLIENT)
    finally:
        p.close()
        env.stop()
    calls = tls_tokenizer.tokenizer.snapshot()
    if trusted:
        assert_rewritten(res, 1234)
        assert len(calls) == 1 and calls[0].header("host") == f"{TLS_NAME}:8443"
        assert calls[0].header_all("authorization") == [CFG_SECRET]
        assert PROMPT_CANARY.encode() in calls[0].body
    else:
        assert calls == []
        assert res.source == "estimate", res.describe()
        assert_rewritten(res, estimate(res.sent), exact=False)
        assert res.delta.get("incontext_tokenizer_failures_status") == 1, res.delta


# --- the canary: nothing secret in the log ------------------------------------------------------
@pytest.mark.last("module")
def test_log_never_contains_credentials_or_prompts(sp, senv, upstream, envoys):
    """Many outcomes with the canaries in prompts and headers, then the whole log is searched.
    Marked to run last in this module (it stops the module's Envoy to flush the log)."""
    t = upstream.tokenizer
    t.count(100)
    body = dumps(chat(prompt("exact"), max_tokens=100000))
    assert sp.post(body, headers=CLIENT).action == "rewritten"
    assert sp.post(body, headers=CLIENT).source == "cache"
    t.count(40000)  # no room: rejected (exact count, reject mode)
    res = sp.post(chat(prompt("reject")), headers=CLIENT)
    assert res.status == 400 and res.action == "rejected", res.describe()
    t.always(("raw", 200, f"<html>{PROMPT_CANARY} {CFG_SECRET}".encode(), "text/html"))
    assert sp.post(chat(prompt("garbage"), max_tokens=100000), headers=CLIENT).source == "estimate"
    t.always(("raw", 500, f'{{"error": "{PROMPT_CANARY} {ENV_SECRET}"}}'.encode(),
              "application/json"))
    assert sp.post(chat(prompt("status"), max_tokens=100000), headers=CLIENT).source == "estimate"
    t.close()
    assert sp.post(chat(prompt("reset"), max_tokens=100000), headers=CLIENT).source == "estimate"
    assert_unchanged(sp.post(f"{PROMPT_CANARY} not json".encode(), headers=CLIENT), "not_json")
    assert_unchanged(sp.post(dumps([PROMPT_CANARY]), headers=CLIENT), "not_object")
    t.count(100)
    res = sp.post(dumps({"model": "test/model", "prompt": prompt("completion"),
                         "max_tokens": 100000}), path="/v1/completions", headers=CLIENT)
    assert res.action == "rewritten", res.describe()
    senv.stop()  # flush the log
    log = senv.log_bytes()
    assert b"incontext" in log and b"rewritten" in log, "no wasm debug log lines: canary void"
    # ... and the logs of this module's TLS Envoys (stopped already)
    for path in sorted(envoys.workdir.glob(f"envoy-tls-*-{senv.glue}.log")):
        log += b"\n" + path.read_bytes()
    for part in SECRET_PARTS + [PROMPT_CANARY]:
        assert part.encode() not in log, (
            f"{part!r} found in Envoy's log: "
            + next(line for line in log.decode("utf-8", "replace").splitlines() if part in line))
