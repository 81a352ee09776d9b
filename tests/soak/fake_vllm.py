"""A fast asyncio stand-in for vLLM for the chaos soak: an echo server and a flapping tokenizer.

Two listeners in one process (run it as a subprocess, so the soak driver does not share a GIL
with it):

* the **echo** port answers every request with 200 and the exact request body it received, plus
  headers saying what it saw (``x-echo-method``, ``x-echo-path``, ``x-echo-length``,
  ``x-echo-content-length``, ``x-echo-chunked``, ``x-echo-sha256``); ``GET /__phases`` answers
  the tokenizer's phase log and per-phase call counts as JSON.
* the **tokenizer** port fakes vLLM's ``POST /tokenize``. It flaps through a fixed cycle of
  states. A phase ends after ``--phase-seconds`` of load *and* once it has answered
  ``--min-calls`` calls (a "refused" phase gets no calls, so time alone ends it; any phase ends
  after four times ``--phase-seconds``). With ``--wait-go`` the clock only runs while the
  driver says the load is on: it writes ``go`` and ``pause`` lines on stdin. So every fault
  meets traffic however fast or slow the machine is, and none falls into a pause.

  ========== ==========================================================================
  up         ``{"count": N, "max_model_len": C, "tokens": [...]}``, N read from the
             ``count=N`` marker in the payload (the soak puts one in every prompt)
  refused    the listener is closed and open connections are aborted: connection refused
  503        ``503 Service Unavailable``
  slow       answers correctly, but only after ``--slow-seconds`` (past the filter's timeout)
  garbage    a bad answer, rotating: not JSON, truncated JSON, wrong types, negative count,
             ``max_model_len`` mismatch, a 2 MiB body (over the filter's 1 MiB read limit)
  reset      closes the connection without answering
  ========== ==========================================================================

Prints one JSON line ``{"echo_port": .., "tokenizer_port": ..}`` on stdout when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import signal
import socket
import sys
import time

CYCLE = ["up", "refused", "up", "slow", "up", "garbage", "up", "503", "up", "reset"]
COUNT_RE = re.compile(rb"count=(\d+)")
GARBAGE = [
    (200, b"<html>not json at all"),
    (200, b'{"count": 12, "max_model_'),
    (200, b'{"count": "12", "max_model_len": 32768}'),
    (200, b'{"count": -3, "max_model_len": 32768}'),
    (200, b'{"count": 12, "max_model_len": 1234}'),
    (200, b'{"count": 5, "max_model_len": 32768, "pad": "' + b"x" * (2 << 20) + b'"}'),
    (200, b"[1, 2, 3]"),
    (200, b""),
]
REASONS = {200: b"OK", 503: b"Service Unavailable", 404: b"Not Found", 400: b"Bad Request"}


class BadRequest(Exception):
    pass


async def read_request(reader: asyncio.StreamReader):
    """(method, path, headers {lower: value}, body, chunked) or None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise BadRequest("truncated head") from e
    lines = head[:-4].split(b"\r\n")
    try:
        method, path, _ = lines[0].decode("latin-1").split(" ", 2)
    except ValueError as e:
        raise BadRequest("bad request line") from e
    headers = {}
    for line in lines[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    if chunked:
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        body = bytes(body)
    else:
        n = int(headers.get("content-length") or 0)
        body = await reader.readexactly(n) if n else b""
    return method, path, headers, body, chunked


def response(status: int, body: bytes, extra=(), ctype=b"application/json") -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"X")),
           b"content-type: " + ctype + b"\r\n",
           b"content-length: %d\r\n" % len(body)]
    for k, v in extra:
        out.append(k.encode() + b": " + str(v).encode() + b"\r\n")
    out.append(b"\r\n")
    return b"".join(out) + body


class Servers:
    def __init__(self, args):
        self.args = args
        self.echo_server = None
        self.tok_server = None
        self.tok_port = args.tokenizer_port
        self.tok_conns = set()
        self.state = "up"
        self.phase_index = 0
        self.phases = []           # [start time (unix), state]
        self.calls = {}            # state -> tokenizer calls answered in that state
        self.phase_calls = 0       # calls answered in the current phase
        self.running = asyncio.Event()
        self.garbage_i = 0
        self.echoed = 0

    # --- echo ------------------------------------------------------------------------------
    async def echo(self, reader, writer):
        try:
            while True:
                req = await read_request(reader)
                if req is None:
                    break
                method, path, headers, body, chunked = req
                if path == "/__phases":
                    data = json.dumps({"phases": self.phases, "calls": self.calls,
                                       "echoed": self.echoed, "state": self.state}).encode()
                    writer.write(response(200, data))
                else:
                    self.echoed += 1
                    extra = [("x-echo", "1"), ("x-echo-method", method), ("x-echo-path", path),
                             ("x-echo-length", len(body)),
                             ("x-echo-content-length", headers.get("content-length", "none")),
                             ("x-echo-chunked", int(chunked)),
                             ("x-echo-sha256", hashlib.sha256(body).hexdigest())]
                    writer.write(response(200, body, extra, b"application/octet-stream"))
                await writer.drain()
        except (BadRequest, ConnectionError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    # --- tokenizer -------------------------------------------------------------------------
    async def tokenize(self, reader, writer):
        self.tok_conns.add(writer)
        try:
            while True:
                if self.state == "refused":
                    break
                req = await read_request(reader)
                if req is None:
                    break
                state = self.state
                self.calls[state] = self.calls.get(state, 0) + 1
                self.phase_calls += 1
                body = req[3]
                if state == "refused" or state == "reset":
                    writer.transport.abort()
                    return
                if state == "503":
                    writer.write(response(503, b'{"error": "overloaded"}'))
                elif state == "garbage":
                    status, data = GARBAGE[self.garbage_i % len(GARBAGE)]
                    self.garbage_i += 1
                    writer.write(response(status, data))
                else:
                    if state == "slow":
                        await asyncio.sleep(self.args.slow_seconds)
                    m = COUNT_RE.search(body)
                    n = int(m.group(1)) if m else 1
                    data = json.dumps({"count": n, "max_model_len": self.args.max_model_len,
                                       "tokens": list(range(min(n, 32)))}).encode()
                    writer.write(response(200, data))
                await writer.drain()
        except (BadRequest, ConnectionError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            pass
        finally:
            self.tok_conns.discard(writer)
            writer.close()

    async def open_tokenizer(self):
        self.tok_server = await asyncio.start_server(
            self.tokenize, "127.0.0.1", self.tok_port, reuse_address=True, limit=1 << 20,
            backlog=1024)
        self.tok_port = self.tok_server.sockets[0].getsockname()[1]

    async def close_tokenizer(self):
        if self.tok_server is not None:
            self.tok_server.close()
            self.tok_server = None
        for w in list(self.tok_conns):
            w.transport.abort()
        self.tok_conns.clear()

    def phase_over(self, active: float) -> bool:
        p = self.args.phase_seconds
        if active < p:
            return False
        if self.state == "refused" or self.phase_calls >= self.args.min_calls:
            return True
        return active >= 4 * p

    async def flap(self):
        if self.args.phase_seconds <= 0:
            self.phases.append([time.time(), "up"])
            return
        tick = 0.02
        active = 0.0
        while True:
            await self.running.wait()
            await asyncio.sleep(tick)
            if not self.running.is_set():
                continue
            active += tick
            if not self.phase_over(active):
                continue
            active = 0.0
            self.phase_index += 1
            new = CYCLE[self.phase_index % len(CYCLE)]
            if new == "refused":
                self.state = new
                await self.close_tokenizer()
            elif self.state == "refused":
                for _ in range(50):
                    try:
                        await self.open_tokenizer()
                        break
                    except OSError:
                        await asyncio.sleep(0.05)
                self.state = new
            else:
                self.state = new
            self.phase_calls = 0
            self.phases.append([time.time(), new])

    async def commands(self, loop):
        """``go`` starts or resumes the phase clock, ``pause`` stops it, EOF resumes it."""
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            word = line.strip()
            if word == "pause":
                self.running.clear()
            else:
                if not self.running.is_set() and not self.phases:
                    self.phases.append([time.time(), "up"])
                self.running.set()
            if not line:
                return

    async def main(self):
        self.echo_server = await asyncio.start_server(
            self.echo, "127.0.0.1", self.args.echo_port, reuse_address=True, limit=1 << 20,
            backlog=1024)
        await self.open_tokenizer()
        self.phases.append([time.time(), "up"])
        echo_port = self.echo_server.sockets[0].getsockname()[1]
        print(json.dumps({"echo_port": echo_port, "tokenizer_port": self.tok_port}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # with --wait-go the phase clock runs only while the driver says the load is on
        if self.args.wait_go:
            self.phases = []
            commander = asyncio.create_task(self.commands(loop))
        else:
            self.running.set()
        flapper = asyncio.create_task(self.flap())
        await stop.wait()
        flapper.cancel()
        if self.args.wait_go:
            commander.cancel()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--echo-port", type=int, default=0)
    ap.add_argument("--tokenizer-port", type=int, default=0)
    ap.add_argument("--phase-seconds", type=float, default=2.0,
                    help="seconds per tokenizer state; 0 keeps it up")
    ap.add_argument("--slow-seconds", type=float, default=0.6)
    ap.add_argument("--min-calls", type=int, default=len(GARBAGE),
                    help="calls a phase must answer before it ends (not for refused)")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--wait-go", action="store_true",
                    help="run the phase clock only between 'go' and 'pause' lines on stdin")
    args = ap.parse_args()
    if args.tokenizer_port == 0:
        # a fixed port, so the tokenizer can come back on it after a "refused" phase
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.tokenizer_port = s.getsockname()[1]
    asyncio.run(Servers(args).main())


if __name__ == "__main__":
    main()
