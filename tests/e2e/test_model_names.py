"""Every table in shared data is bounded, whatever model names clients send.

A client may name a new model in every request. Each name is a key of the learned context
lengths, the anchors and the flags, and each new prompt a key of the count cache; all of them
are fixed sets of slots (docs/spec.md §7), so once they are full Envoy's memory stays flat.

The test sends 5,000 requests, each with its own model name and prompt, counted by a tokenizer
that reports the window (vLLM's `/tokenize` does), so every table takes a key from each. Then it
reads Envoy's allocated heap (tcmalloc's `/memory`, where shared data lives for both builds),
sends 5,000 more names, and reads it again. A table that kept one key per name grew Envoy's heap
by about 185 bytes a name: 925 KB over the second 5,000. The heap may move by the allocator's
noise (connections, stats, buffers), about ±200 KB here; flat means under 350 KB.
"""

from __future__ import annotations

import http.client
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from urllib.parse import urlsplit

import pytest

from tests.e2e.common import cfg, chat, dumps
from tests.harness.upstream import ok

pytestmark = pytest.mark.timeout(300)

NAMES = 5000
CLIENTS = 4
# What a second round of NAMES may add to Envoy's heap and still be flat.
FLAT_BYTES = 350_000


def _send_range(url: str, start: int, stop: int, step: int) -> list:
    """POSTs for models start, start + step, ... below stop on one kept-alive connection (in a
    process of its own: the upstream answers in this one): the statuses seen."""
    parsed = urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    statuses = []
    try:
        for i in range(start, stop, step):
            body = dumps(chat(f"prompt {i}", max_tokens=100000, model=f"model-{i}"))
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            statuses.append(r.status)
    finally:
        conn.close()
    return statuses


def _send_names(url: str, first: int, n: int) -> list:
    """Requests for models first .. first + n - 1, CLIENTS at a time: the statuses seen."""
    with ProcessPoolExecutor(CLIENTS, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = [pool.submit(_send_range, url, first + k, first + n, CLIENTS)
                 for k in range(CLIENTS)]
        return [s for part in parts for s in part.result()]


def _allocated(envoy) -> int:
    """Envoy's allocated heap, the median of three reads a moment apart."""
    reads = []
    for _ in range(3):
        time.sleep(0.3)
        reads.append(envoy.memory()["allocated"])
    return int(statistics.median(reads))


def test_new_model_names_leave_envoy_memory_flat_once_the_tables_are_full(proxy_for, upstream):
    # No configured window: each count's answer teaches one per model name. Count slots few
    # enough to be full after the first round. Every prompt is longer than its window and
    # answered by the filter (`on_insufficient: reject`): the upstream's time goes to counting.
    proxy = proxy_for(cfg(context_length=None, cache_entries=512, on_insufficient="reject"),
                      fresh=True)
    upstream.tokenizer.always(ok(9000, 8192, with_tokens=False))
    envoy = proxy.envoy

    statuses = _send_names(envoy.url, 0, NAMES)
    assert statuses.count(400) == NAMES
    full = _allocated(envoy)
    counters = envoy.counters()
    assert counters["incontext_rejected"] == NAMES, counters
    assert counters["incontext_count_calls"] == NAMES, counters

    statuses = _send_names(envoy.url, NAMES, NAMES)
    assert statuses.count(400) == NAMES
    after = _allocated(envoy)
    counters = envoy.counters()
    assert counters["incontext_rejected"] == 2 * NAMES, counters
    assert len(upstream.tokenizer.snapshot()) == 2 * NAMES
    assert upstream.snapshot() == []

    grown = after - full
    print(f"model names: heap {full} -> {after} ({grown:+d} bytes)")
    assert grown < FLAT_BYTES, (
        f"Envoy's heap grew {grown} bytes over {NAMES} more model names "
        f"({full} -> {after}): a table keeps a key per name")
