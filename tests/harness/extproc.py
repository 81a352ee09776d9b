"""A scripted Envoy external processor (envoy.service.ext_proc.v3.ExternalProcessor/Process):
gRPC over HTTP/2 on raw sockets (the h2 package the suite already uses), with the few
protobuf messages it needs encoded by hand.

It stands in for Envoy AI Gateway's processor in its two places:

* ``RouterProcessor``, the router-level ext_proc (request headers SEND, body BUFFERED): keeps
  the request body it receives (its copy, keyed by ``x-request-id``), and answers the body
  phase as the AI Gateway does: CONTINUE with ``x-ai-eg-model`` set to the body's ``model`` and
  the route cache cleared, no body mutation.
* ``UpstreamProcessor``, the ext_proc among the cluster's upstream HTTP filters (request
  headers SEND, body NONE): with ``rebuild`` set it answers the request headers with
  CONTINUE_AND_REPLACE and a body mutation that is the router-level copy, as the AI Gateway's
  upstream filter does whenever it rebuilds the request (a backend's model name override, a
  schema translation, a body mutation, a retry); with ``rebuild`` unset it answers CONTINUE
  and leaves the body alone (an OpenAI backend without override). The AI Gateway restamps
  Content-Length after a rebuild through a header-mutation filter; this one does not, so a
  rebuilt body goes upstream chunked.

Every stream is recorded: which phases arrived, the request body the processor was given.
Nothing is logged.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import h2.config
import h2.connection
import h2.events
import h2.exceptions

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


# --- protobuf, the fields used here -----------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> Tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, i
        shift += 7


def fields(buf: bytes) -> List[Tuple[int, object]]:
    """(field number, value) of one message: an int for varints, bytes for length-delimited;
    fixed-width fields are skipped."""
    out, i = [], 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
            out.append((num, v))
        elif wt == 2:
            n, i = _read_varint(buf, i)
            out.append((num, buf[i:i + n]))
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
    return out


def _first(buf: bytes, num: int, default=None):
    return next((v for n, v in fields(buf) if n == num), default)


def _len(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _int(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v)


# envoy.service.ext_proc.v3 field numbers
REQ_HEADERS, RESP_HEADERS, REQ_BODY, RESP_BODY = 2, 3, 4, 5        # ProcessingRequest
OUT_REQ_HEADERS, OUT_RESP_HEADERS, OUT_REQ_BODY, OUT_RESP_BODY = 1, 2, 3, 4  # ProcessingResponse
CONTINUE, CONTINUE_AND_REPLACE = 0, 1                              # CommonResponse.status


def headers_of(http_headers: bytes) -> List[Tuple[str, str]]:
    """HttpHeaders.headers (HeaderMap) as (key, value); Envoy sends raw_value."""
    out = []
    hmap = _first(http_headers, 1, b"")
    for n, hv in fields(hmap):
        if n == 1:
            f = dict(fields(hv))
            value = f.get(3, f.get(2, b""))
            out.append((f.get(1, b"").decode(), value.decode("utf-8", "replace")))
    return out


def common_response(*, status: int = CONTINUE, set_headers: Dict[str, str] = None,
                    body: Optional[bytes] = None, clear_route_cache: bool = False) -> bytes:
    out = b""
    if status:
        out += _int(1, status)
    if set_headers:
        hm = b""
        for k, v in set_headers.items():
            # HeaderValueOption{header: HeaderValue{key, raw_value}, append_action:
            # OVERWRITE_IF_EXISTS_OR_ADD (2)}
            hm += _len(1, _len(1, _len(1, k.encode()) + _len(3, v.encode())) + _int(3, 2))
        out += _len(2, hm)
    if body is not None:
        out += _len(3, _len(1, body))    # BodyMutation.body
    if clear_route_cache:
        out += _int(5, 1)
    return out


def processing_response(which: int, common: bytes = b"") -> bytes:
    """A ProcessingResponse with HeadersResponse/BodyResponse{response: common} at ``which``."""
    return _len(which, _len(1, common) if common else b"")


# --- the server -------------------------------------------------------------------------------
@dataclass
class Stream:
    """One Process stream: one HTTP request as the processor saw it."""
    id: int
    phases: List[str] = field(default_factory=list)
    headers: List[Tuple[str, str]] = field(default_factory=list)
    body: Optional[bytes] = None
    buf: bytearray = field(default_factory=bytearray)

    def header(self, name: str) -> Optional[str]:
        return next((v for k, v in self.headers if k.lower() == name), None)


class ExtProcServer:
    """Serves Process on 127.0.0.1:<port>; subclasses answer each ProcessingRequest."""

    def __init__(self, host: str = "127.0.0.1"):
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.streams: List[Stream] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.host, self.port = self.sock.getsockname()[:2]
        self._stop = threading.Event()
        self._open: List[socket.socket] = []

    def start(self) -> "ExtProcServer":
        threading.Thread(target=self._accept, daemon=True, name="extproc").start()
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
        with self.lock:
            self.streams = []

    def snapshot(self) -> List[Stream]:
        with self.lock:
            return list(self.streams)

    def answer(self, st: Stream, kind: int, msg: bytes) -> Optional[bytes]:
        raise NotImplementedError

    def _accept(self):
        while not self._stop.is_set():
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self._open.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s: socket.socket):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        live: Dict[int, Stream] = {}
        try:
            s.sendall(conn.data_to_send())
            while True:
                data = s.recv(65536)
                if not data:
                    return
                for ev in conn.receive_data(data):
                    self._event(conn, live, ev)
                out = conn.data_to_send()
                if out:
                    s.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            return
        finally:
            with self.lock:
                if s in self._open:
                    self._open.remove(s)
            try:
                s.close()
            except OSError:
                pass

    def _event(self, conn, live: Dict[int, Stream], ev):
        if isinstance(ev, h2.events.RequestReceived):
            path = dict(ev.headers).get(":path")
            if path != PROCESS:
                conn.send_headers(ev.stream_id, [(":status", "200"),
                                                 ("content-type", "application/grpc"),
                                                 ("grpc-status", "12")], end_stream=True)
                return
            st = Stream(id=ev.stream_id)
            live[ev.stream_id] = st
            with self.cond:
                self.streams.append(st)
            conn.send_headers(ev.stream_id, [(":status", "200"),
                                             ("content-type", "application/grpc")])
        elif isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            st = live.get(ev.stream_id)
            if st is None:
                return
            st.buf += ev.data
            while len(st.buf) >= 5:
                n = struct.unpack(">I", bytes(st.buf[1:5]))[0]
                if len(st.buf) < 5 + n:
                    break
                msg = bytes(st.buf[5:5 + n])
                del st.buf[:5 + n]
                for kind, payload in fields(msg):
                    if kind in (REQ_HEADERS, RESP_HEADERS, REQ_BODY, RESP_BODY):
                        with self.cond:
                            reply = self.answer(st, kind, payload)
                            self.cond.notify_all()
                        if reply is not None:
                            conn.send_data(ev.stream_id,
                                           b"\x00" + struct.pack(">I", len(reply)) + reply)
        elif isinstance(ev, h2.events.StreamEnded):
            if live.pop(ev.stream_id, None) is not None:
                conn.send_headers(ev.stream_id, [("grpc-status", "0")], end_stream=True)
        elif isinstance(ev, h2.events.StreamReset):
            live.pop(ev.stream_id, None)


class RouterProcessor(ExtProcServer):
    """The AI Gateway's router-level ext_proc: keeps the body it reads."""

    def __init__(self):
        super().__init__()
        self.copies: Dict[str, bytes] = {}   # x-request-id -> the body this processor read

    def answer(self, st: Stream, kind: int, msg: bytes) -> Optional[bytes]:
        if kind == REQ_HEADERS:
            st.phases.append("request_headers")
            st.headers = headers_of(msg)
            return processing_response(OUT_REQ_HEADERS)
        if kind == REQ_BODY:
            st.phases.append("request_body")
            chunk = _first(msg, 1, b"")
            st.body = (st.body or b"") + chunk
            rid = st.header("x-request-id")
            if rid is not None:
                self.copies[rid] = st.body
            try:
                model = str(json.loads(st.body).get("model", ""))
            except (ValueError, AttributeError):
                model = ""
            return processing_response(OUT_REQ_BODY, common_response(
                set_headers={"x-ai-eg-model": model}, clear_route_cache=True))
        if kind == RESP_HEADERS:
            st.phases.append("response_headers")
            return processing_response(OUT_RESP_HEADERS)
        st.phases.append("response_body")
        return processing_response(OUT_RESP_BODY)

    def bodies(self) -> List[bytes]:
        """The request bodies this processor was given, one per request."""
        return [st.body for st in self.snapshot() if st.body is not None]


class UpstreamProcessor(ExtProcServer):
    """The AI Gateway's upstream-filter ext_proc: rebuilds the body from the router's copy."""

    def __init__(self, router: RouterProcessor):
        super().__init__()
        self.router = router
        self.rebuild = True
        self.replaced: List[bool] = []

    def reset(self):
        super().reset()
        self.replaced = []

    def answer(self, st: Stream, kind: int, msg: bytes) -> Optional[bytes]:
        if kind != REQ_HEADERS:
            st.phases.append({REQ_BODY: "request_body", RESP_HEADERS: "response_headers",
                              RESP_BODY: "response_body"}[kind])
            return processing_response({REQ_BODY: OUT_REQ_BODY, RESP_HEADERS: OUT_RESP_HEADERS,
                                        RESP_BODY: OUT_RESP_BODY}[kind])
        st.phases.append("request_headers")
        st.headers = headers_of(msg)
        copy = self.router.copies.get(st.header("x-request-id") or "")
        if self.rebuild and copy is not None:
            self.replaced.append(True)
            return processing_response(OUT_REQ_HEADERS, common_response(
                status=CONTINUE_AND_REPLACE, body=copy))
        self.replaced.append(False)
        return processing_response(OUT_REQ_HEADERS)
