"""Memory of the native module's Envoy after abandoned large requests (docs/module.md, "Speed
and memory").

The real Envoy 1.40 runs envoy/envoy-module.yaml as shipped (its `memory_allocator_manager`
included), with the environment docs/module.md asks for (`GLIBC_TUNABLES=glibc.pthread.rseq=0`,
so that Envoy's allocator keeps per-CPU caches rather than per-thread ones), in front of a
scripted tokenizer that reads every call and never answers, so each
budgeted request stays held while its count is out (and each count whose client left is made
again by the configuration, held by Envoy until its timeout). 500 requests of 4 MiB, 64 at a time, are
abandoned by their clients: in each wave half of them once their count is out (Envoy holds the
body and the module its copy and the count call), half in the middle of their body (Envoy and
the module still buffering). Afterwards Envoy's resident memory must come back to within 10 %
of what it was after a warm-up wave of the same requests: nothing a gone request held stays,
neither in the module nor in Envoy's allocator. The allocator keeps the pages a burst needed
for a minute before it gives them back, so the test waits for that twice (after the warm-up
and at the end): it takes about 2.5 minutes.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest

from tests.e2e.common import MAIN
from tests.harness.envoy import Envoy

pytestmark = pytest.mark.timeout(360)

BODY_BYTES = 4 << 20
REQUESTS = 500
AT_ONCE = 64
TOLERANCE = 0.10
# How long Envoy has to give freed memory back: the allocator holds what a burst needed for
# its one-minute subrelease interval, then releases it within seconds.
SETTLE_S = 100.0
# What the allocator may keep free once it has given memory back.
FREE_MIB = 16
# Envoy's environment as docs/module.md gives it.
ENVIRONMENT = {"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}


class SilentTokenizer:
    """An upstream that reads whatever comes and never answers; it counts the requests whose
    whole head has arrived."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.heads = 0
        self.closed = False

    def start(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket):
        seen = b""
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 20)
                except OSError:
                    return
                if not data:
                    return
                # A request line at the start of a connection or after a body is enough: Envoy
                # sends one call per connection at a time and never gets an answer.
                window = seen[-64:] + data
                found = window.count(b"POST /tokenize")
                if found:
                    with self.lock:
                        self.heads += found
                seen = window[-64:]

    def count(self) -> int:
        with self.lock:
            return self.heads

    def close(self):
        self.closed = True
        self.sock.close()


def rss_kb(envoy: Envoy) -> int:
    return envoy.memory()["rss"] // 1024


def stat(envoy: Envoy, name: str) -> int:
    with urllib.request.urlopen(f"{envoy.admin}/stats?format=json&filter=^{name}$",
                                timeout=5) as r:
        stats = json.load(r)["stats"]
    values = [s["value"] for s in stats if s.get("name") == name]
    assert len(values) == 1, f"stat {name}: {stats}"
    return int(values[0])


def allocator(envoy: Envoy) -> dict:
    """Envoy's /memory in MiB: `allocated` is what is in use, `pageheap_free` what the
    allocator holds free without giving it back."""
    mem = envoy.memory()
    return {k: round(mem.get(k, 0) / 2**20, 1)
            for k in ("allocated", "heap_size", "pageheap_free", "pageheap_unmapped")}


def settle(envoy: Envoy, what: str) -> int:
    """Waits until the allocator has given back what it holds free (it keeps the pages a burst
    needed for its one-minute subrelease interval), then Envoy's RSS in kB."""
    deadline = time.monotonic() + SETTLE_S
    while (allocator(envoy)["pageheap_free"] > FREE_MIB
           and time.monotonic() < deadline):
        time.sleep(1)
    held = allocator(envoy)
    assert held["pageheap_free"] <= FREE_MIB, (
        f"{SETTLE_S:.0f} s after {what}, Envoy's allocator still holds freed memory: {held} MiB")
    time.sleep(1)
    return rss_kb(envoy)


def request_bytes(port: int, size: int, i: int) -> bytes:
    """A chat request of `size` bytes whose prompt is unique (a count is needed)."""
    head = json.dumps({"model": "m", "max_tokens": 100000,
                       "messages": [{"role": "user", "content": f"abandoned {i} "}]})
    pad = size - len(head)
    body = head.replace(f"abandoned {i} ", f"abandoned {i} " + "x" * pad).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def abandon_wave(envoy: Envoy, tokenizer: SilentTokenizer, first: int, n: int, size: int):
    """`n` requests at once: even ones sent whole and left once their count is out, odd ones
    left halfway through their body."""
    socks = []
    whole = 0
    before = tokenizer.count()
    try:
        for k in range(n):
            s = socket.create_connection(("127.0.0.1", envoy.port), timeout=30)
            socks.append(s)
            data = request_bytes(envoy.port, size, first + k)
            if k % 2 == 0:
                s.sendall(data)
                whole += 1
            else:
                s.sendall(data[: len(data) // 2])
        # The counts of the wave before, made again by the configuration once their clients
        # left (docs/module.md), arrive meanwhile too: at least this wave's are out.
        deadline = time.monotonic() + 30
        while tokenizer.count() - before < whole and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tokenizer.count() - before >= whole, \
            f"{tokenizer.count() - before} count calls out, {whole} expected at least"
    finally:
        for s in socks:
            # A reset, as a client that gives up does: nothing lingers on Envoy's side.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()


def wait_idle(envoy: Envoy, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while stat(envoy, "http.llm.downstream_rq_active") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stat(envoy, "http.llm.downstream_rq_active") == 0, "requests still active"


@pytest.mark.glues("module")
def test_abandoned_large_requests_leave_no_memory_behind(envoy_bin, glue, tmp_path):
    tokenizer = SilentTokenizer().start()
    # The counts stay out while a wave is sent (a few seconds); the ones the configuration
    # makes again after their clients left end at this timeout, well before the allocator's
    # release interval.
    plugin = {**MAIN, "tokenizer": {**MAIN["tokenizer"], "timeout_ms": 15000},
              "context_length": 1 << 20}
    envoy = Envoy(envoy_bin, tmp_path, plugin, ("127.0.0.1", tokenizer.port), glue="module",
                  name="module", log_args=("-l", "info"), env=ENVIRONMENT)
    envoy.start()
    try:
        # Warm-up: one wave of the same requests (connections, pools, the module's table, the
        # allocator's caches and metadata for such a burst), and the allocator settled.
        abandon_wave(envoy, tokenizer, 0, AT_ONCE, BODY_BYTES)
        wait_idle(envoy)
        start = settle(envoy, "the warm-up")
        peak = start
        sent = 0
        while sent < REQUESTS:
            n = min(AT_ONCE, REQUESTS - sent)
            abandon_wave(envoy, tokenizer, AT_ONCE + sent, n, BODY_BYTES)
            sent += n
            peak = max(peak, rss_kb(envoy))
        wait_idle(envoy)
        # The waves held at least 32 bodies of 4 MiB at once: memory must have grown.
        assert peak - start > 32 * BODY_BYTES // 1024, f"RSS {start} -> peak {peak} kB"
        now = settle(envoy, f"{REQUESTS} abandoned requests")
        print(f"RSS {start} kB after warm-up, {peak} kB at the peak, {now} kB at the end")
        assert now <= start * (1 + TOLERANCE), (
            f"Envoy's RSS {start} kB after warm-up, {peak} kB at the peak, {now} kB after "
            f"{REQUESTS} abandoned requests; allocator: {allocator(envoy)} MiB")
    finally:
        envoy.stop()
        tokenizer.close()
