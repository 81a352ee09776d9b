"""One threaded HTTP/1.1 server that stands in for vLLM behind Envoy.

* ``POST <tokenizer path>`` (``/tokenize``) is a scriptable fake of vLLM's tokenizer: it answers
  ``{"count": N, "max_model_len": C, "tokens": [...]}`` or misbehaves on request (500, garbage,
  wrong types, a slow answer, a closed connection) and records every call (payload bytes and
  headers).
* Every other request is echoed: 200 with a JSON body holding the method, path, headers and the
  exact received body (base64 and sha256). Each echoed request is recorded too, so tests can
  compare the bytes Envoy sent upstream with the bytes the client sent.
* A request with ``x-test-answer: NAME`` is recorded and answered with the scripted
  ``Answer`` registered as ``upstream.answers[NAME]`` (any status, headers and body, written in
  separate chunks, optionally waiting on a ``Gate`` before the last one): the fault injection
  of the answer side.

The filter sends ``/tokenize`` to the same Envoy cluster as the route, so one server serves both.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional, Tuple

DEFAULT_MAX_MODEL_LEN = 32768


@dataclass
class Record:
    method: str
    path: str
    headers: List[Tuple[str, str]]
    body: bytes
    chunked: bool
    at: float = field(default_factory=time.monotonic)

    def header(self, name: str) -> Optional[str]:
        """Value of the first header called ``name`` (case-insensitive), or None."""
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def header_all(self, name: str) -> List[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def json(self):
        return json.loads(self.body)


# A tokenizer action is what the fake tokenizer does for one call.
#   ("json", status, obj)        answer with json.dumps(obj)
#   ("raw", status, bytes, ctype) answer these bytes
#   ("sleep", seconds, action)   sleep, then do action (Envoy has usually timed out by then)
#   ("close",)                   close the connection without answering
Action = tuple


def tokens_for(count: int) -> list:
    """A realistic ``tokens`` list (vLLM returns one id per token)."""
    return [(7 * i + 11) % 151000 for i in range(count)]


def ok(count, max_model_len=DEFAULT_MAX_MODEL_LEN, with_tokens=True) -> Action:
    obj = {"count": count, "max_model_len": max_model_len}
    if with_tokens and isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 200000:
        obj["tokens"] = tokens_for(count)
    return ("json", 200, obj)


class Gate:
    """Holds the tokenizer's answers until ``open()``: a test waits on events, not on time.

    ``wait_answered(n)`` returns once ``n`` held answers have been written (or after its
    timeout, with how many were). A gate still closed when the tokenizer is reset opens then,
    and any held answer is given up after ``hold_limit`` seconds."""

    def __init__(self, hold_limit: float = 120.0):
        self._open = threading.Event()
        self._cond = threading.Condition()
        self.hold_limit = hold_limit
        self.answered = 0

    def open(self):
        self._open.set()

    def hold(self):
        self._open.wait(self.hold_limit)

    def done(self):
        with self._cond:
            self.answered += 1
            self._cond.notify_all()

    def wait_answered(self, n: int, timeout: float = 10.0) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.answered >= n, timeout)
            return self.answered


@dataclass
class Answer:
    """A scripted answer: status, headers and the body's pieces, each sent as its own chunk
    (and flushed) with ``pause`` seconds between them. ``{max_tokens}`` in a piece becomes the
    ``max_tokens`` (or ``max_output_tokens``) of the request as it arrived, so an answer can
    use exactly the cap the filter wrote. With ``length``, the body goes with a Content-Length
    instead of chunked; ``gate`` holds the last piece until it opens; ``trailers`` end a
    chunked body (Envoy reads them only from a cluster with HTTP/1 trailers enabled)."""

    status: int
    pieces: List[bytes]
    headers: List[Tuple[str, str]] = field(default_factory=lambda: [("Content-Type", "application/json")])
    pause: float = 0.0
    length: bool = False
    gate: Optional["Gate"] = None
    trailers: List[Tuple[str, str]] = field(default_factory=list)


class Tokenizer:
    """Scriptable fake tokenizer. ``behaviour(record) -> Action`` decides each answer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: List[Record] = []
        self.reset()

    def reset(self):
        with self.lock:
            for gate in getattr(self, "_gates", ()):
                gate.open()
            self._gates: List[Gate] = []
            self.calls = []
            self._queue: List[Action] = []
            self._behaviour: Callable[[Record], Action] = lambda rec: ok(100)

    # --- scripting -------------------------------------------------------------------------
    def respond(self, behaviour: Callable[[Record], Action]):
        """Answer every later call with ``behaviour(record)``."""
        with self.lock:
            self._behaviour = behaviour

    def always(self, action: Action):
        self.respond(lambda rec: action)

    def count(self, n, max_model_len=DEFAULT_MAX_MODEL_LEN):
        self.always(ok(n, max_model_len))

    def status(self, code=500, body=b'{"error":"boom"}'):
        self.always(("raw", code, body, "application/json"))

    def garbage(self, body=b"this is <not> json {"):
        self.always(("raw", 200, body, "application/json"))

    def slow(self, seconds, then=None):
        self.always(("sleep", seconds, then or ok(100)))

    def held(self, then=None) -> Gate:
        """Every later call waits until the returned gate opens, then answers ``then``."""
        gate = Gate()
        with self.lock:
            self._gates.append(gate)
        self.always(("gate", gate, then or ok(100)))
        return gate

    def close(self):
        self.always(("close",))

    def then(self, *actions: Action):
        """Queue one-shot actions, used before the standing behaviour."""
        with self.lock:
            self._queue.extend(actions)

    # --- serving ---------------------------------------------------------------------------
    def next_action(self, rec: Record) -> Action:
        with self.lock:
            self.calls.append(rec)
            if self._queue:
                return self._queue.pop(0)
            behaviour = self._behaviour
        return behaviour(rec)

    def snapshot(self) -> List[Record]:
        with self.lock:
            return list(self.calls)


class Upstream:
    def __init__(self, host="127.0.0.1", port=0, tokenizer_path="/tokenize"):
        self.tokenizer_path = tokenizer_path
        self.tokenizer = Tokenizer()
        self.lock = threading.Lock()
        self.requests: List[Record] = []
        self.answers: dict = {}
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "fake-vllm/1"
            # Headers and body go in separate writes: with Nagle's algorithm each answer on a
            # kept-alive connection waits for the peer's delayed ACK (~40 ms).
            disable_nagle_algorithm = True

            def log_message(self, fmt, *args):  # keep pytest output quiet
                pass

            def _read_body(self) -> Tuple[bytes, bool]:
                te = (self.headers.get("Transfer-Encoding") or "").lower()
                if "chunked" in te:
                    out = bytearray()
                    while True:
                        line = self.rfile.readline(65537)
                        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            # trailers until the empty line
                            while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out), True
                        out += self.rfile.read(size)
                        self.rfile.readline(65537)  # CRLF after the chunk
                n = int(self.headers.get("Content-Length") or 0)
                return (self.rfile.read(n) if n else b""), False

            def _send(self, status: int, body: bytes, ctype="application/json", extra=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _handle(self):
                body, chunked = self._read_body()
                rec = Record(self.command, self.path, list(self.headers.items()), body, chunked)
                if self.command == "POST" and self.path.split("?", 1)[0] == upstream.tokenizer_path:
                    self._tokenize(rec)
                    return
                with upstream.lock:
                    upstream.requests.append(rec)
                if rec.header("x-test-answer"):
                    self._scripted(upstream.answers[rec.header("x-test-answer")], rec)
                    return
                if rec.header("x-test-stream"):
                    self._stream(int(rec.header("x-test-stream")), rec)
                    return
                echo = {
                    "method": rec.method,
                    "path": rec.path,
                    "headers": rec.headers,
                    "body_len": len(body),
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "chunked": chunked,
                }
                if len(body) <= 1 << 20:
                    echo["body_b64"] = base64.b64encode(body).decode()
                    echo["body"] = body.decode("utf-8", "replace")
                self._send(200, json.dumps(echo).encode())

            def _scripted(self, answer: "Answer", rec: Record):
                cap = b""
                try:
                    obj = json.loads(rec.body)
                    cap = str(obj.get("max_tokens", obj.get("max_output_tokens", ""))).encode()
                except (ValueError, AttributeError):
                    pass
                pieces = [p.replace(b"{max_tokens}", cap) for p in answer.pieces]
                self.send_response(answer.status)
                for k, v in answer.headers:
                    self.send_header(k, v)
                if answer.length:
                    self.send_header("Content-Length", str(sum(len(p) for p in pieces)))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, piece in enumerate(pieces):
                    if i + 1 == len(pieces) and answer.gate is not None:
                        answer.gate.hold()
                    if answer.length:
                        self.wfile.write(piece)
                    elif piece:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                    if answer.pause and i + 1 < len(pieces):
                        time.sleep(answer.pause)
                if not answer.length:
                    trailers = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode())
                                        for k, v in answer.trailers)
                    self.wfile.write(b"0\r\n" + trailers + b"\r\n")
                    self.wfile.flush()
                if answer.gate is not None:
                    answer.gate.done()

            def _stream(self, events: int, rec: Record):
                """A slow server-sent-events answer, like a streamed completion."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(events):
                    data = json.dumps({"i": i, "body_sha256": hashlib.sha256(rec.body).hexdigest()})
                    chunk = f"data: {data}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    time.sleep(0.1)
                done = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                self.wfile.flush()

            def _tokenize(self, rec: Record):
                action = upstream.tokenizer.next_action(rec)
                self._act(action)

            def _act(self, action: Action):
                kind = action[0]
                if kind == "json":
                    self._send(action[1], json.dumps(action[2]).encode())
                elif kind == "raw":
                    ctype = action[3] if len(action) > 3 else "application/json"
                    self._send(action[1], action[2], ctype)
                elif kind == "sleep":
                    time.sleep(action[1])
                    try:
                        self._act(action[2])
                    except OSError:
                        self.close_connection = True
                elif kind == "gate":
                    action[1].hold()
                    try:
                        self._act(action[2])
                    except OSError:
                        self.close_connection = True
                    finally:
                        action[1].done()
                elif kind == "close":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                else:
                    raise ValueError(f"unknown tokenizer action {action!r}")

            do_POST = _handle
            do_GET = _handle
            do_PUT = _handle
            do_DELETE = _handle
            do_PATCH = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 2048
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                # Envoy closing a connection (a timed-out or cancelled tokenizer call, an
                # answer too large for it) is expected in the hostile tests: no traceback.
                if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                    return
                super().handle_error(request, client_address)

        self.server = Server((host, port), Handler)
        self.host, self.port = self.server.server_address[:2]
        self.thread = threading.Thread(target=self.server.serve_forever, name="upstream", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def reset(self):
        with self.lock:
            self.requests = []
            for answer in self.answers.values():
                if answer.gate is not None:
                    answer.gate.open()
            self.answers = {}
        self.tokenizer.reset()

    def snapshot(self) -> List[Record]:
        with self.lock:
            return list(self.requests)

    def find(self, needle: bytes) -> List[Record]:
        """Echoed requests whose body contains ``needle``."""
        return [r for r in self.snapshot() if needle in r.body]
