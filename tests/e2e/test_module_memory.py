"""Memory of the native module's Envoy after bursts of large requests, abandoned and served
(docs/module.md, "Speed and memory").

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

Served bursts are held against Envoy itself: two bursts of 64 served requests of 4 MiB, each
held 3 s, through Envoy with its own buffer filter before an upstream that reads late, then
through Envoy with the module whose counts take 3 s. Envoy's allocator keeps most of what
either needed for minutes (its read buffers); 30 s after the bursts the module's Envoy must
have grown by no more than Envoy alone did (within the runs' noise): what the module itself
held (its copies, the count calls) is back.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Tuple

import pytest

from tests.e2e.common import MAIN
from tests.harness.envoy import Envoy, _hcm, render
from tests.harness.upstream import Upstream, ok

pytestmark = pytest.mark.timeout(360)

BODY_BYTES = 4 << 20
REQUESTS = 500
AT_ONCE = 64
TOLERANCE = 0.10
# How long Envoy has to give freed memory back: the allocator holds what a burst needed for
# its one-minute subrelease interval, then releases it within seconds — later when the
# machine is busy (its release runs on Envoy's own background thread). A deadline, not a wait.
SETTLE_S = 180.0
# What the allocator may keep free once it has given memory back: it gives back down to about
# FREE_MIB, on some runs keeps more (22-46 MiB on a quiet machine, 66 MiB beside other suites;
# HELD_MIB at most: half of a burst's 256 MiB). The free pages it keeps are left out of the
# RSS compared.
FREE_MIB = 16
HELD_MIB = 128
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
    needed for its one-minute subrelease interval), then Envoy's RSS in kB less the free pages
    the allocator still keeps."""
    deadline = time.monotonic() + SETTLE_S
    while (allocator(envoy)["pageheap_free"] > FREE_MIB
           and time.monotonic() < deadline):
        time.sleep(1)
    held = allocator(envoy)
    assert held["pageheap_free"] <= HELD_MIB, (
        f"{SETTLE_S:.0f} s after {what}, Envoy's allocator still holds freed memory: {held} MiB")
    time.sleep(1)
    mem = envoy.memory()
    return (mem["rss"] - mem.get("pageheap_free", 0)) // 1024


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
        print(f"RSS (less the allocator's free pages) {start} kB after warm-up, {peak} kB at "
              f"the peak, {now} kB at the end")
        assert now <= start * (1 + TOLERANCE), (
            f"Envoy's RSS less the allocator's free pages {start} kB after warm-up, {peak} kB "
            f"(RSS) at the peak, {now} kB after {REQUESTS} abandoned requests; allocator: "
            f"{allocator(envoy)} MiB")
    finally:
        envoy.stop()
        tokenizer.close()



# Served bursts: the memory after a peak of large requests that were answered, against Envoy
# holding the same bodies as long without the module (its own buffer filter before an upstream
# that reads each body only after the count's time).
SERVED_AT_ONCE = 64
HELD_S = 3.0
IDLE_S = 30.0
WARM_IDLE_S = 5.0
# How much more the module's Envoy may keep than Envoy's own buffering does: what Envoy's
# allocator keeps of the same bursts moves by about 15 % from one run to the next.
SERVED_TOLERANCE = 0.25
SLACK_MIB = 8


class LateReader:
    """An upstream that waits `HELD_S` before it reads a request's body, then answers 200. Its
    receive buffer is small, so that Envoy, not the kernel, holds the body meanwhile."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                time.sleep(HELD_S)
                self.rfile.read(n)
                body = b'{"id":"x","choices":[]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

            def server_bind(self):
                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
                super().server_bind()

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def buffering_envoy(port: int) -> Callable[[int, int], dict]:
    """The shipped bootstrap without incontext, Envoy's buffer filter in its place, its
    upstream connections with a small send buffer (Envoy keeps what the upstream has not
    read)."""

    def config(listen_port: int, admin_port: int) -> dict:
        cfg = render(wasm_path="", listen_port=listen_port, admin_port=admin_port,
                     upstream=("127.0.0.1", port), plugin_config=MAIN, remove_filter=True,
                     glue="module")
        hcm = _hcm(cfg)
        hcm["http_filters"].insert(0, {"name": "envoy.filters.http.buffer", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
            "max_request_bytes": 2 * BODY_BYTES}})
        vllm = next(c for c in cfg["static_resources"]["clusters"] if c["name"] == "vllm")
        vllm["upstream_bind_config"] = {
            "source_address": {"address": "127.0.0.1", "port_value": 0},
            "socket_options": [{"level": socket.SOL_SOCKET, "name": socket.SO_SNDBUF,
                                "int_value": 32768, "state": "STATE_PREBIND"}]}
        return cfg

    return config


def serve_burst(envoy: Envoy, first: int, n: int, size: int):
    """`n` chat requests of `size` bytes at once, each answered; every answer must be a 200."""
    statuses = [0] * n

    def one(k: int):
        raw = request_bytes(envoy.port, size, first + k)
        body = raw.split(b"\r\n\r\n", 1)[1]
        conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=60)
        try:
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            statuses[k] = answer.status
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * n, statuses


def after_bursts(envoy: Envoy, cleared: Callable[[], None] = lambda: None) -> Tuple[int, int, int]:
    """Envoy's RSS in kB when warm (a few requests served), at the peak of two served bursts
    of `SERVED_AT_ONCE`, and `IDLE_S` after them."""
    serve_burst(envoy, 0, 8, BODY_BYTES)
    wait_idle(envoy)
    time.sleep(WARM_IDLE_S)
    warm = rss_kb(envoy)
    samples = [warm]
    done = threading.Event()

    def sample():
        while not done.is_set():
            samples.append(rss_kb(envoy))
            time.sleep(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        for burst in range(2):
            serve_burst(envoy, 1000 * (burst + 1), SERVED_AT_ONCE, BODY_BYTES)
            cleared()
    finally:
        done.set()
        watcher.join()
    wait_idle(envoy)
    time.sleep(IDLE_S)
    return warm, max(samples), rss_kb(envoy)


@pytest.mark.glues("module")
def test_served_bursts_keep_no_more_than_envoys_own_buffering(envoy_bin, glue, tmp_path):
    """Two bursts of 64 served chat requests of 4 MiB, each held 3 s (the module: its count
    is out; Envoy alone: its upstream reads late): 30 s later the module's Envoy has grown by
    no more than Envoy with its own buffer filter has."""
    reader = LateReader()
    alone = Envoy(envoy_bin, tmp_path / "alone", MAIN, ("127.0.0.1", reader.port),
                  glue="module", name="alone", log_args=("-l", "info"), env=ENVIRONMENT,
                  config=buffering_envoy(reader.port))
    alone.start()
    try:
        a_warm, a_peak, a_now = after_bursts(alone)
        a_alloc = allocator(alone)
    finally:
        alone.stop()
        reader.close()

    upstream = Upstream().start()
    upstream.tokenizer.always(("sleep", HELD_S, ok(1000, max_model_len=1 << 20)))

    def cleared():
        with upstream.lock:
            upstream.requests.clear()
        with upstream.tokenizer.lock:
            upstream.tokenizer.calls.clear()

    plugin = {**MAIN, "context_length": 1 << 20}
    envoy = Envoy(envoy_bin, tmp_path / "module", plugin, (upstream.host, upstream.port),
                  glue="module", name="module", log_args=("-l", "info"), env=ENVIRONMENT)
    envoy.start()
    try:
        m_warm, m_peak, m_now = after_bursts(envoy, cleared)
        m_alloc = allocator(envoy)
        calls = envoy.counters().get("incontext_tokenizer_calls")
        assert calls == 2 * SERVED_AT_ONCE + 8, f"{calls} count calls"
    finally:
        envoy.stop()
        upstream.stop()

    report = (f"Envoy alone (buffer filter): {a_warm} kB warm, {a_peak} kB peak, {a_now} kB "
              f"{IDLE_S:.0f} s after, allocator {a_alloc} MiB; with the module: {m_warm} kB "
              f"warm, {m_peak} kB peak, {m_now} kB after, allocator {m_alloc} MiB")
    print(report)
    # Both held the bodies: at least 32 of them at once.
    assert a_peak - a_warm > 32 * BODY_BYTES // 1024, report
    assert m_peak - m_warm > 32 * BODY_BYTES // 1024, report
    assert m_now - m_warm <= (a_now - a_warm) * (1 + SERVED_TOLERANCE) + SLACK_MIB * 1024, report
