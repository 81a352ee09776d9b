"""incontext as a native Envoy dynamic module (crates/module, envoy/envoy-module.yaml) in the
real Envoy, in front of the e2e upstream and its scripted tokenizer.

* a budgeted request is held until its count is back: nothing reaches the upstream before the
  decision, and the rewritten body goes with its own Content-Length (no buffer filter);
* the same prompt again is decided from the shared table, without a call; a long one, seen
  before by the worker, is decided on Envoy's slices (its long values hashed there, not copied
  out) and goes upstream rewritten exactly as when read whole;
* a request that is not budgeted passes byte for byte;
* a configuration the module refuses stops Envoy, with a log line naming the field;
* the module's imports are exactly what this Envoy exports, and it defines every hook Envoy
  looks up.

The module must be built (scripts/build-module.sh): when it is missing the tests fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

import pytest

from tests.e2e.common import (MAIN, Proxy, assert_rewritten, assert_unchanged, chat, dumps,
                              nonce)
from tests.harness.envoy import MODULE, Envoy, EnvoyError, no_filter, validate
from tests.harness.upstream import ok

# The module's own mechanisms (its ABI, holding the head without a buffer filter): module only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.glues("module")]


@pytest.fixture(scope="module")
def module_lib(glue):
    """The module under test (the ``glue`` fixture fails when it is missing)."""
    return MODULE


@pytest.fixture(scope="module")
def envoy(envoy_bin, module_lib, upstream, tmp_path_factory):
    e = Envoy(envoy_bin, tmp_path_factory.mktemp("module"), MAIN,
              (upstream.host, upstream.port), glue="module", name="module",
              remove_filter=no_filter())
    e.start()
    yield e
    e.stop()


@pytest.fixture
def proxy(envoy, upstream):
    p = Proxy(envoy, upstream)
    yield p
    p.close()


def test_a_request_is_held_until_its_count_then_rewritten(proxy, upstream, envoy):
    P = 1234
    gate = upstream.tokenizer.held(then=ok(P))
    body = chat(max_tokens=100000)
    out = {}
    before = envoy.counters()

    def send():
        out["res"] = proxy.post(body, counters=False)

    t = threading.Thread(target=send)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not upstream.tokenizer.snapshot() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(upstream.tokenizer.snapshot()) == 1, "no tokenizer call while the request waits"
        # The count is still out: the request (head and body) has not gone upstream.
        time.sleep(0.3)
        assert upstream.snapshot() == [], "the upstream saw the request before the decision"
    finally:
        gate.open()
        t.join(30)
    res = out["res"]
    res.delta = {k: v - before.get(k, 0) for k, v in envoy.counters().items()
                 if v != before.get(k, 0)}
    assert_rewritten(res, P)
    assert res.one.header("transfer-encoding") is None, res.describe()
    assert res.delta == {"incontext_requests": 1, "incontext_rewritten": 1,
                         "incontext_tokenizer_calls": 1, "incontext_count_calls": 1,
                         "incontext_cache_misses": 1}, res.describe()


def test_the_same_prompt_again_is_counted_from_the_shared_table(proxy, upstream):
    # Envoy runs two workers: each sees what the other stored.
    counted_once_then_hits(proxy, upstream, chat(max_tokens=100000), 4)


def counted_once_then_hits(proxy, upstream, body, repeats):
    """``body`` is counted once (2000 tokens), then decided from the table ``repeats`` times,
    each rewritten exactly as the first, with no call."""
    P = 2000
    upstream.tokenizer.count(P)
    first = proxy.post(body)
    assert_rewritten(first, P)
    assert len(first.tokenize) == 1, first.describe()
    for _ in range(repeats):
        again = proxy.post(body)
        assert_rewritten(again, P, source="cache")
        assert len(again.tokenize) == 0, again.describe()
        assert again.delta == {"incontext_requests": 1, "incontext_rewritten": 1,
                               "incontext_cache_hits": 1}, again.describe()


@pytest.mark.parametrize("cap", [{"max_tokens": 100000}, {}], ids=["cap", "no-cap"])
def test_a_long_prompt_again_is_decided_on_envoys_slices(proxy, upstream, cap):
    """A prompt of about 200 KB with 12 KB of tools, sent again and again: each worker skims it
    once, proves its guess on the next hit, then reads it in part (docs/module.md). Every
    answer goes upstream rewritten exactly: in place with a cap, whole without one (the
    appended cap does not fit in place, so the body is read whole to be written)."""
    text = "".join(f"line {i} of {nonce()}: the quick brown fox\n" for i in range(4000))
    tool = {"type": "function", "function": {"name": "read", "description": "d" * 6000,
                                             "parameters": {"type": "object"}}}
    counted_once_then_hits(proxy, upstream, chat(content=text, tools=[tool, tool], **cap), 10)


def test_a_request_that_is_not_budgeted_passes_as_it_came(proxy, upstream):
    get = proxy.get()
    assert get.status == 200, get.describe()
    assert get.action == "unchanged:method", get.describe()
    assert len(get.upstream) == 1 and len(get.tokenize) == 0, get.describe()
    assert get.delta == {"incontext_requests": 1, "incontext_unchanged_method": 1}

    raw = dumps(chat(max_tokens=100000))
    gz = proxy.post(raw, headers={"content-encoding": "gzip"})
    assert_unchanged(gz, "encoding", tokenize_calls=0)
    assert gz.delta == {"incontext_requests": 1, "incontext_unchanged_encoding": 1}


def test_a_refused_configuration_names_its_field(envoy_bin, module_lib, tmp_path):
    bad = dict(MAIN, min_output_tokens="many")
    rc, out = validate(envoy_bin, tmp_path, bad, glue="module")
    assert rc != 0, f"the module accepted a bad configuration:\n{out[-2000:]}"
    lines = [l for l in out.splitlines() if "incontext: invalid configuration" in l]
    assert len(lines) == 1 and "min_output_tokens" in lines[0], out[-3000:]
    rc, out = validate(envoy_bin, tmp_path, MAIN, glue="module", name="good")
    assert rc == 0, out[-3000:]

    e = Envoy(envoy_bin, tmp_path, bad, ("127.0.0.1", 9), glue="module", name="refused",
              refusal_expected=True)
    with pytest.raises(EnvoyError):
        e.start(timeout=30)
    assert "min_output_tokens" in e.log_text()


def _symbols(path, defined: bool):
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the module's symbols"
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run([nm, "-D", flag, str(path)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_the_module_binds_what_this_envoy_exports(envoy_bin, module_lib):
    imports = {s for s in _symbols(module_lib, defined=False) if s.startswith("envoy_")}
    exported = _symbols(envoy_bin, defined=True)
    assert len(imports) == 24, sorted(imports)
    assert imports <= exported, sorted(imports - exported)
    # Every HTTP filter hook Envoy looks up (their names are in its binary) is defined.
    text = open(envoy_bin, "rb").read()
    looked_up = {m.decode() for m in re.findall(
        rb"(?<![a-z_])(envoy_dynamic_module_on_(?:program_init|http_filter_[a-z_]+))\x00", text)}
    hooks = {s for s in _symbols(module_lib, defined=True) if s.startswith("envoy_dynamic_module_on")}
    optional = {h for h in looked_up if "_config_" in h and not h.endswith(("_config_new",
                "_config_destroy"))} | {"envoy_dynamic_module_on_http_filter_local_reply"}
    # Envoy 1.40 names 31 (its optional ones: configuration-level calls and streams, local
    # replies); the module defines all 23 it requires.
    assert len(looked_up) == 31, sorted(looked_up)
    assert len(looked_up - optional) == 23, sorted(looked_up - optional)
    assert looked_up - optional <= hooks, sorted(looked_up - optional - hooks)
