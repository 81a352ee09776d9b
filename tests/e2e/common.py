"""Shared constants and the client helper the e2e tests use."""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
import socket
from typing import Dict, List, Optional, Tuple

import httpx

from tests.harness.upstream import Record

# The numbers of the main test configuration.
C = 32768          # context_length (and the tokenizer's max_model_len)
R = 4096           # min_output_tokens
F = 1024           # fallback_margin_tokens
W = C              # window_tokens defaults to C
MODEL = "test/model"
TOKENIZER_AUTHORITY = "vllm:8000"
EXTRA_HEADER = ("x-tokenizer-key", "tk-123")

MAIN = {
    "tokenizer": {
        "cluster": "vllm",
        "authority": TOKENIZER_AUTHORITY,
        "timeout_ms": 30000,   # a count is never late here but on a machine busy with other suites
        "headers": {EXTRA_HEADER[0]: EXTRA_HEADER[1]},
    },
    "context_length": C,
    "min_output_tokens": R,
    "fallback_margin_tokens": F,
}

HEADER_NAMES = ("x-incontext-action", "x-incontext-prompt-tokens", "x-incontext-source",
                "x-incontext-max-tokens")


def cfg(**changes) -> dict:
    """MAIN with top-level changes; a value of None removes the key. ``tokenizer=`` merges."""
    out = copy.deepcopy(MAIN)
    for k, v in changes.items():
        if k == "tokenizer":
            out["tokenizer"].update(v)
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def nonce() -> str:
    return uuid.uuid4().hex[:12]


def chat(content: Optional[str] = None, **extra) -> dict:
    """A chat body with a unique prompt (so the shared count cache never crosses tests)."""
    body = {"model": MODEL,
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": content if content is not None
                          else f"hello {nonce()}"}]}
    body.update(extra)
    return body


def completion(prompt=None, **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt if prompt is not None else f"once upon {nonce()}"}
    body.update(extra)
    return body


def dumps(obj) -> bytes:
    """The client's bytes: deliberately not compact, so byte-identity checks mean something."""
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


@dataclass
class Result:
    response: httpx.Response
    sent: bytes
    upstream: List[Record]
    tokenize: List[Record]
    delta: Dict[str, int] = field(default_factory=dict)

    @property
    def status(self) -> int:
        return self.response.status_code

    def h(self, name: str) -> Optional[str]:
        return self.response.headers.get(name)

    @property
    def action(self) -> Optional[str]:
        return self.h("x-incontext-action")

    @property
    def source(self) -> Optional[str]:
        return self.h("x-incontext-source")

    @property
    def one(self) -> Record:
        """The single upstream (echo) request this call produced."""
        assert len(self.upstream) == 1, f"expected 1 upstream request, got {len(self.upstream)}"
        return self.upstream[0]

    @property
    def body_up(self) -> bytes:
        return self.one.body

    def json_up(self):
        return json.loads(self.body_up)

    def describe(self) -> str:
        hs = {k: v for k, v in self.response.headers.items() if k.startswith("x-incontext")}
        return (f"status={self.status} headers={hs} tokenize_calls={len(self.tokenize)} "
                f"delta={self.delta}")


class Proxy:
    """Sends requests through one Envoy and collects what the upstream saw for each."""

    def __init__(self, envoy, upstream):
        self.envoy = envoy
        self.upstream = upstream
        self.client = httpx.Client(base_url=envoy.url, timeout=60.0)

    def close(self):
        self.client.close()

    def send(self, method: str, path: str, body: Optional[bytes] = None,
             headers: Optional[dict] = None, counters=True) -> Result:
        before_up = len(self.upstream.snapshot())
        before_tok = len(self.upstream.tokenizer.snapshot())
        before = self.envoy.counters() if counters else {}
        hdrs = {"content-type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        resp = self.client.request(method, path, content=body, headers=hdrs)
        after = self.envoy.counters() if counters else {}
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        return Result(resp, body or b"", self.upstream.snapshot()[before_up:],
                      self.upstream.tokenizer.snapshot()[before_tok:], delta)

    def post(self, body, path: str = "/v1/chat/completions", headers=None, **kw) -> Result:
        raw = body if isinstance(body, (bytes, bytearray)) else dumps(body)
        return self.send("POST", path, bytes(raw), headers, **kw)

    def get(self, path: str = "/v1/models", headers=None) -> Result:
        return self.send("GET", path, None, headers)


# --- assertions shared by the tests ----------------------------------------------------------
def assert_content_length(rec: Record):
    cl = rec.header("content-length")
    assert cl is not None and int(cl) == len(rec.body), (
        f"upstream Content-Length {cl!r} != body length {len(rec.body)} "
        f"(transfer-encoding={rec.header('transfer-encoding')!r})")


def assert_unchanged(res: Result, reason: Optional[str], *, tokenize_calls: Optional[int] = None):
    """Not rewritten: the upstream got the client's bytes exactly."""
    if reason is not None:
        assert res.action == f"unchanged:{reason}", res.describe()
    assert res.status == 200, res.describe()
    rec = res.one
    assert rec.body == res.sent, (f"upstream body differs from the client's:\n sent {res.sent[:300]!r}"
                                  f"\n got  {rec.body[:300]!r}")
    if res.sent:
        assert_content_length(rec)
    assert res.h("x-incontext-max-tokens") is None, res.describe()
    if tokenize_calls is not None:
        assert len(res.tokenize) == tokenize_calls, res.describe()


def assert_rewritten(res: Result, P: int, exact: bool = True, *, source: Optional[str] = None,
                     W_: int = None, C_: int = None, R_: int = None, F_: int = None, T=None):
    """Rewritten exactly as docs/spec.md §2 says for prompt count P; returns the Decision."""
    from tests.harness.spec import decide, non_cap_members_kept, rewritten_obj

    obj = json.loads(res.sent)
    d = decide(obj, P, exact, W=W if W_ is None else W_, C=C if C_ is None else C_,
               R=R if R_ is None else R_, F=F if F_ is None else F_, T=T)
    assert d.rewrite, f"test bug: docs/spec.md says no rewrite here ({d})"
    assert res.status == 200, res.describe()
    assert res.action == "rewritten", f"expected rewritten to {d.field}={d.value}; {res.describe()}"
    assert res.h("x-incontext-max-tokens") == str(d.value), res.describe()
    assert res.h("x-incontext-prompt-tokens") == str(P), res.describe()
    want_source = source or ("exact" if exact else "estimate")
    assert res.source == want_source, res.describe()
    rec = res.one
    got = json.loads(rec.body)
    want = rewritten_obj(obj, d)
    assert got == want, f"upstream body {got} != expected {want}"
    assert isinstance(got[d.field], int) and not isinstance(got[d.field], bool)
    problems = non_cap_members_kept(res.sent, rec.body)
    assert not problems, problems
    assert_content_length(rec)
    return d


@dataclass
class H2Answer:
    status: int
    headers: List[Tuple[str, str]]
    body: bytes
    trailers: List[Tuple[str, str]]


def h2_post(port: int, path: str, body: bytes, headers=(), trailers=None,
            timeout: float = 30.0) -> H2Answer:
    """One HTTP/2 (h2c, prior knowledge) POST by hand: httpx neither sends request trailers
    nor reads response trailers. ``trailers`` end the request body; the answer comes with
    its own trailers."""
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"),
                                (":authority", "x"), ("content-type", "application/json"),
                                *headers])
        conn.send_data(sid, body, end_stream=trailers is None)
        if trailers is not None:
            conn.send_headers(sid, trailers, end_stream=True)
        s.sendall(conn.data_to_send())
        head, data, tail, done = [], b"", [], False
        while not done:
            chunk = s.recv(65536)
            if not chunk:
                break
            for ev in conn.receive_data(chunk):
                if isinstance(ev, h2.events.ResponseReceived):
                    head = [(k.decode(), v.decode()) for k, v in ev.headers]
                elif isinstance(ev, h2.events.DataReceived):
                    data += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.TrailersReceived):
                    tail = [(k.decode(), v.decode()) for k, v in ev.headers]
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = True
            s.sendall(conn.data_to_send())
    status = int(dict(head)[":status"])
    return H2Answer(status, [h for h in head if not h[0].startswith(":")], data, tail)
