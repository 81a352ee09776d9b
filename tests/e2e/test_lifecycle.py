"""The filter's life in a running Envoy: what it holds for requests whose client gave up, and
its log level.

500 requests of 4 MiB are abandoned while their count is out: the client sends the whole body,
waits until the tokenizer has the call, and closes the connection. The scripted tokenizer holds
every answer of a batch of 50 until the batch's clients are all gone, then answers them all.
Each abandoned request leaves an orphan (docs/spec.md §7) that keeps the cache key and the
model, not the body, so the VMs' linear memory (the filter's gauge
`incontext_wasm_memory_bytes`, summed over Envoy's two workers) stays flat: it grows by less
than one body after the first batch, and by the filter's working set (far less than 50 bodies)
in it. A filter that kept the bodies grows by 50 × 4 MiB in the first batch and on from there. Every step waits for the event it needs
(the tokenizer's call, the orphan gauge), never for a fixed time.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from tests.e2e.common import Proxy, assert_rewritten, cfg, chat, dumps, nonce
from tests.harness.envoy import DEBUG_LOG, Envoy, no_filter
from tests.harness.upstream import ok

BODY_BYTES = 4 << 20
BATCHES = 10
PER_BATCH = 50
COUNT = 100
# The filter's own working set for one 4 MiB request (its copy of the body, the count payload)
# and the allocator's slack; far below what 50 kept bodies take.
GROWTH_BOUND = 48 << 20
LIFECYCLE = cfg(tokenizer={"timeout_ms": 300000})


def wait_for(what: str, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def big_body(tag: str, i: int) -> bytes:
    filler = "lorem ipsum " * (BODY_BYTES // 12)
    body = dumps(chat(f"{tag} {i} {filler}", max_tokens=100000))
    assert BODY_BYTES <= len(body) < BODY_BYTES + 4096
    return body


def abandon(port: int, body: bytes):
    """Sends the whole request; returns the open socket (the client has not given up yet)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
              b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    s.sendall(body)
    return s


@pytest.mark.glues("wasm")   # the wasm memory gauge, orphans (tests/e2e/README.md)
def test_abandoned_big_requests_leave_memory_flat(envoys, upstream, glue):
    env = envoys.get(LIFECYCLE, glue=glue, fresh=True)
    baseline_vms = env.wasm_stats()
    gate = threading.Event()

    def answer(rec):
        gate.wait(300)
        return ok(COUNT)

    # One small request first: the gauges exist and the VM memory is recorded.
    p = Proxy(env, upstream)
    try:
        upstream.tokenizer.count(COUNT)
        assert_rewritten(p.post(chat(max_tokens=100000)), COUNT)
    finally:
        p.close()
    wait_for("the memory gauge", lambda: env.gauges().get("incontext_wasm_memory_bytes", 0) > 0)
    start = env.gauges()["incontext_wasm_memory_bytes"]
    before = env.counters()

    tag = nonce()
    memory = []
    last_body = b""
    for batch in range(BATCHES):
        upstream.reset()
        gate.clear()
        upstream.tokenizer.respond(answer)
        for i in range(PER_BATCH):
            last_body = big_body(f"{tag} {batch}", i)
            s = abandon(env.port, last_body)
            wait_for("the tokenizer call", lambda: len(upstream.tokenizer.snapshot()) == i + 1)
            s.close()
            wait_for("the orphan", lambda: env.gauges().get("incontext_orphans") == i + 1)
        memory.append(env.gauges()["incontext_wasm_memory_bytes"])
        # The slow tokenizer now counts the batch; every late answer is stored.
        gate.set()
        wait_for("the late answers", lambda: env.gauges().get("incontext_orphans") == 0)

    assert env.alive(), env.log_tail()
    n = BATCHES * PER_BATCH
    now = env.counters()
    delta = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
    assert delta == {"incontext_requests": n, "incontext_cache_misses": n,
                     "incontext_tokenizer_calls": n, "incontext_count_calls": n}, delta
    assert memory[0] - start < GROWTH_BOUND, (start, memory)
    # Flat: over the 450 requests after the first batch the VMs do not grow by one body (the
    # allocator may take a page or two more, e.g. 128 KiB on one run).
    assert max(memory) - memory[0] < BODY_BYTES, f"memory grew after the first batch: {memory}"
    assert not env.vm_failures(baseline_vms), env.vm_failures(baseline_vms)
    assert "panic" not in env.log_text()

    # The late answers were stored: the last abandoned prompt again is a cache hit.
    upstream.reset()
    upstream.tokenizer.count(COUNT + 1)   # would show if the tokenizer were asked again
    p = Proxy(env, upstream)
    try:
        res = p.post(last_body)
    finally:
        p.close()
    assert_rewritten(res, COUNT, source="cache")


def test_the_log_level_follows_envoys_at_run_time(envoy_bin, glue, upstream, envoys):
    """Envoy starts with the filter's component (wasm, or dynamic_modules) at info: the
    filter's per-request debug line is not written. Once the operator sets it to debug through
    the admin endpoint, the next request's is."""
    env = Envoy(envoy_bin, envoys.workdir, LIFECYCLE, (upstream.host, upstream.port),
                remove_filter=no_filter(), name=f"envoy-log-level-{glue}", log_args=("-l", "info"),
                glue=glue)
    env.start()
    p = Proxy(env, upstream)
    try:
        upstream.tokenizer.count(111)
        assert_rewritten(p.post(chat(max_tokens=100000)), 111)
        req = urllib.request.Request(env.admin + "/logging?" + DEBUG_LOG[glue].replace(":", "="),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200
        upstream.tokenizer.count(222)
        assert_rewritten(p.post(chat(max_tokens=100000)), 222)
    finally:
        p.close()
    # Envoy flushes its log file every few seconds: wait for the second request's line.
    wait_for("the debug line", lambda: "incontext: rewritten prompt=222" in env.log_text(),
             timeout=30)
    assert "incontext: rewritten prompt=111" not in env.log_text()
    env.stop()
