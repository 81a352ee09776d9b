"""A recording HTTP/1.1 upstream: what reached the server behind Envoy, and when.

Written on raw sockets (not http.server) so that it sees what a parser that waits for whole
requests would hide:

* every TCP connection, when it opened and closed, and every byte it received with the time
  each read returned;
* every request's headers (``content-length`` and ``transfer-encoding`` included) and the time
  the header block was complete, before any of the body was read;
* the body bytes, whether they came chunked, and whether the request was cut off (the
  connection ended before the body was complete, as when Envoy resets an upstream request).

It serves the filter's tokenizer calls too (Envoy sends ``/tokenize`` to the same cluster as
the route, as every gateway manifest here does): ``tokenizer`` scripts the answer and its delay,
and records when each answer was sent. Every other request is echoed (200, JSON describing
what arrived), after its whole body by default, or as soon as its headers are in with
``answer_on_headers`` (as a health-check or auth upstream may answer).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

DEFAULT_MAX_MODEL_LEN = 32768


@dataclass
class Request:
    conn: int
    method: str
    path: str
    headers: List[Tuple[str, str]]
    headers_at: float                 # monotonic time the header block was complete
    body: bytes = b""
    chunked: bool = False
    complete: bool = False            # the whole body arrived
    body_at: Optional[float] = None   # when it did
    answered_at: Optional[float] = None

    def header(self, name: str) -> Optional[str]:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def content_length(self) -> Optional[str]:
        return self.header("content-length")

    @property
    def transfer_encoding(self) -> Optional[str]:
        return self.header("transfer-encoding")

    def summary(self) -> dict:
        return {
            "conn": self.conn, "method": self.method, "path": self.path,
            "content-length": self.content_length, "transfer-encoding": self.transfer_encoding,
            "body_len": len(self.body), "complete": self.complete,
        }


@dataclass
class Connection:
    id: int
    opened_at: float
    closed_at: Optional[float] = None
    reads: List[Tuple[float, int]] = field(default_factory=list)   # (time, bytes) per recv
    raw: bytearray = field(default_factory=bytearray)

    @property
    def first_byte_at(self) -> Optional[float]:
        return self.reads[0][0] if self.reads else None

    def bytes_before(self, t: float) -> int:
        return sum(n for at, n in self.reads if at < t)


class Tokenizer:
    """The scripted /tokenize answer: count, max_model_len and a delay before answering."""

    def __init__(self):
        self.lock = threading.Lock()
        self.set(100)

    def set(self, count: int, max_model_len: int = DEFAULT_MAX_MODEL_LEN, delay: float = 0.0):
        with self.lock:
            self.count, self.max_model_len, self.delay = count, max_model_len, delay

    def answer(self) -> Tuple[float, bytes]:
        with self.lock:
            count, mml, delay = self.count, self.max_model_len, self.delay
        body = json.dumps({"count": count, "max_model_len": mml,
                           "tokens": [(7 * i + 11) % 151000 for i in range(count)]}).encode()
        return delay, body


class _Closed(Exception):
    pass


class _Reader:
    """Buffered reads from one connection, recording every recv."""

    def __init__(self, sock: socket.socket, conn: Connection, lock: threading.Lock):
        self.sock, self.conn, self.lock = sock, conn, lock
        self.buf = bytearray()

    def fill(self):
        data = self.sock.recv(65536)
        now = time.monotonic()
        if not data:
            raise _Closed()
        with self.lock:
            self.conn.reads.append((now, len(data)))
            self.conn.raw += data
        self.buf += data

    def until(self, sep: bytes, limit: int = 1 << 20) -> bytes:
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out = bytes(self.buf[: i + len(sep)])
                del self.buf[: i + len(sep)]
                return out
            if len(self.buf) > limit:
                raise _Closed()
            self.fill()

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class RecordingUpstream:
    def __init__(self, host: str = "127.0.0.1", tokenizer_path: str = "/tokenize"):
        self.tokenizer_path = tokenizer_path
        self.tokenizer = Tokenizer()
        self.answer_on_headers = False
        self.lock = threading.Lock()
        self.connections: List[Connection] = []
        self.requests: List[Request] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(256)
        self.host, self.port = self.sock.getsockname()[:2]
        self._stop = threading.Event()
        self._accept_thread = threading.Thread(target=self._accept, name="recorder", daemon=True)
        self._open: List[socket.socket] = []

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "RecordingUpstream":
        self._accept_thread.start()
        return self

    def stop(self):
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            socks = list(self._open)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def reset(self):
        """Forget what was recorded (connections still open stay open, recorded afresh)."""
        with self.lock:
            self.connections = [c for c in self.connections if c.closed_at is None]
            for c in self.connections:
                c.reads, c.raw = [], bytearray()
            self.requests = []
        self.tokenizer.set(100)
        self.answer_on_headers = False

    # --- views ---------------------------------------------------------------------------------
    def snapshot(self) -> Tuple[List[Connection], List[Request]]:
        with self.lock:
            return list(self.connections), list(self.requests)

    def tokenize_calls(self) -> List[Request]:
        return [r for r in self.snapshot()[1] if r.path.split("?", 1)[0] == self.tokenizer_path]

    def forwarded(self) -> List[Request]:
        """Requests other than the filter's tokenizer calls: what the client's request became."""
        return [r for r in self.snapshot()[1] if r.path.split("?", 1)[0] != self.tokenizer_path]

    # --- serving -------------------------------------------------------------------------------
    def _accept(self):
        n = 0
        while not self._stop.is_set():
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            n += 1
            conn = Connection(id=n, opened_at=time.monotonic())
            with self.lock:
                self.connections.append(conn)
                self._open.append(s)
            threading.Thread(target=self._serve, args=(s, conn), daemon=True,
                             name=f"recorder-conn{n}").start()

    def _serve(self, s: socket.socket, conn: Connection):
        reader = _Reader(s, conn, self.lock)
        try:
            while True:
                self._one(s, reader, conn)
        except (_Closed, OSError, ValueError):
            pass
        finally:
            with self.lock:
                conn.closed_at = time.monotonic()
                if s in self._open:
                    self._open.remove(s)
            try:
                s.close()
            except OSError:
                pass

    def _one(self, s: socket.socket, reader: _Reader, conn: Connection):
        head = reader.until(b"\r\n\r\n")
        headers_at = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers.append((k.strip(), v.strip()))
        req = Request(conn=conn.id, method=method, path=path, headers=headers,
                      headers_at=headers_at)
        with self.lock:
            self.requests.append(req)
        te = (req.transfer_encoding or "").lower()
        req.chunked = "chunked" in te
        is_tokenize = path.split("?", 1)[0] == self.tokenizer_path
        if not is_tokenize and self.answer_on_headers:
            self._send(s, req, 200, json.dumps({"answered": "on headers"}).encode(),
                       close=False)
        body = bytearray()
        if req.chunked:
            while True:
                size_line = reader.until(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while reader.until(b"\r\n") != b"\r\n":
                        pass
                    break
                body += reader.exactly(size)
                reader.exactly(2)
                req.body = bytes(body)
        elif req.content_length is not None:
            body += reader.exactly(int(req.content_length))
        req.body = bytes(body)
        req.complete, req.body_at = True, time.monotonic()
        if is_tokenize:
            delay, answer = self.tokenizer.answer()
            if delay:
                time.sleep(delay)
            self._send(s, req, 200, answer)
        elif not self.answer_on_headers:
            echo = {
                "method": method, "path": path, "headers": headers,
                "body_len": len(req.body), "body_sha256": hashlib.sha256(req.body).hexdigest(),
                "chunked": req.chunked, "body": req.body.decode("utf-8", "replace"),
            }
            self._send(s, req, 200, json.dumps(echo).encode())

    def _send(self, s: socket.socket, req: Request, status: int, body: bytes, close=False):
        head = (f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n" + ("connection: close\r\n" if close else "")
                + "\r\n").encode()
        req.answered_at = time.monotonic()
        s.sendall(head + body)
