#!/usr/bin/env python3
"""N conversations interleaved turn by turn through one Envoy + incontext, on the shipped
defaults: how many grown turns still go upstream without a count on their path, and how much
Envoy's heap grows.

    .venv/bin/python bench/sessions/interleaved.py [--glue wasm|module] [--sessions 50 1000 ...]
        [--turns 4] [--filter-config JSON] [--jsonl FILE] [--label NAME]

Every session's turn t goes before any session's turn t+1, as concurrent agents interleave: a
round sends turn t of every session (64 at a time), waits for the filter's counts after the
answers (the checks of the turns sent on a bound) to end, then the next round starts. Each
conversation is an OpenAI chat with tools whose every turn adds a tool round (an assistant tool
call and a 200-byte tool result), its first message unique. The upstream is scripted (one
process for the model server and its tokenizer): `/tokenize` answers a count of one token per
8 bytes of the payload and a window of 40960, a chat answers at once. Each N runs in a fresh
Envoy (the same build, `--concurrency 2`).

Per N: the share of grown turns (turn 2 onward) whose answer says `x-incontext-source: bound`
(no count on the request's path), the same from the counters (`count_skipped` per grown turn),
the counters `evictions` and `evicted_recounts` where the build has them, and Envoy's heap
(`/memory` allocated and heap_size; RSS) before the first round and after the last.

INCONTEXT_WASM / INCONTEXT_MODULE name another build (tests/harness/envoy.py), e.g. an older one.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This directory's concurrent.py is no stdlib `concurrent` (asyncio imports that).
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.harness import envoy as harness  # noqa: E402

WINDOW = 40960
CAP = 16000
IN_FLIGHT = 64
MODEL = "bench-model"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}]


class Upstream:
    """The scripted model server and tokenizer, on its own event loop in a thread."""

    def __init__(self):
        self.tokenize = 0
        self.chats = 0
        self.port = harness.free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _tokenize(self, request):
        body = await request.read()
        self.tokenize += 1
        return web.json_response({"count": max(1, len(body) // 8), "max_model_len": WINDOW})

    async def _chat(self, request):
        await request.read()
        self.chats += 1
        return web.json_response({
            "id": "c", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}]})

    def _run(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=1 << 24)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", self.port, backlog=1024)
        self.loop.run_until_complete(site.start())
        self.ready.set()
        self.loop.run_forever()

    def start(self):
        self.thread.start()
        self.ready.wait(10)
        return self


def conversation(session: int, turn: int) -> bytes:
    """Turn `turn` (0-based) of conversation `session`."""
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                {"role": "user", "content": f"Fix the failing test in module {session}, please."}]
    for i in range(turn):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "read", "arguments": json.dumps({"path": f"src/f{i}.py"})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"{session}:{i} " + "x" * 200}]
    return json.dumps({"model": MODEL, "messages": messages, "tools": TOOLS,
                       "max_tokens": CAP}).encode()


async def one_round(session, url, sessions, turn):
    """Turn `turn` of every session; the sources the answers name."""
    sem = asyncio.Semaphore(IN_FLIGHT)
    sources = {}

    async def send(s):
        async with sem:
            async with session.post(url, data=conversation(s, turn),
                                    headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"session {s} turn {turn}: HTTP {r.status}")
                src = r.headers.get("x-incontext-source", "none")
                sources[src] = sources.get(src, 0) + 1

    await asyncio.gather(*(send(s) for s in range(sessions)))
    return sources


def settle(upstream, quiet=0.3, limit=60.0):
    """Waits until no tokenizer call arrived for `quiet` seconds."""
    deadline = time.monotonic() + limit
    last, since = upstream.tokenize, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if upstream.tokenize != last:
            last, since = upstream.tokenize, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def run_one(glue, n, turns, extra, workdir):
    upstream = Upstream().start()
    plugin = harness.shipped_plugin_config()
    plugin.update(extra)
    binary = harness.envoy_binary()
    if not binary:
        raise SystemExit("no Envoy: run scripts/test.sh setup")
    env = harness.Envoy(binary, workdir, plugin, ("127.0.0.1", upstream.port), glue=glue,
                        name=f"{glue}-{n}", log_args=("-l", "warning"))
    env.start()
    try:
        before_mem = env.memory()
        before = env.counters()
        t0 = time.monotonic()
        by_turn = []

        async def drive():
            conn = aiohttp.TCPConnector(limit=IN_FLIGHT)
            async with aiohttp.ClientSession(connector=conn) as s:
                for t in range(turns):
                    by_turn.append(await one_round(s, env.url + "/v1/chat/completions", n, t))
                    settle(upstream)

        asyncio.run(drive())
        wall = time.monotonic() - t0
        after_mem = env.memory()
        after = env.counters()
    finally:
        env.stop()
        upstream.loop.call_soon_threadsafe(upstream.loop.stop)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    grown = n * (turns - 1)
    bound = sum(r.get("bound", 0) for r in by_turn[1:])
    return {
        "glue": glue, "sessions": n, "turns": turns, "config": extra,
        "grown": grown, "bound": bound, "share": bound / grown,
        "skipped_share": delta.get("incontext_count_skipped", 0) / grown,
        "sources_by_turn": by_turn,
        "count_calls": delta.get("incontext_count_calls", 0),
        "tail_counts": delta.get("incontext_tail_counts", 0),
        "evictions": delta.get("incontext_evictions"),
        "evicted_recounts": delta.get("incontext_evicted_recounts"),
        "tokenize_calls": upstream.tokenize,
        "heap_allocated_growth": after_mem.get("allocated", 0) - before_mem.get("allocated", 0),
        "heap_size_growth": after_mem.get("heap_size", 0) - before_mem.get("heap_size", 0),
        "rss_growth": after_mem.get("rss", 0) - before_mem.get("rss", 0),
        "wall_s": round(wall, 1),
    }


def mib(n):
    return f"{n / (1 << 20):+.1f}"


def markdown(jsonl):
    """The rows of `jsonl` as a table, by label, build and N; each share also as a ratio to
    the 50-session share of the same label and build."""
    rows = [json.loads(line) for line in Path(jsonl).read_text(encoding="utf-8").splitlines()
            if line.strip()]
    base = {(r["label"], r["glue"]): r["share"] for r in rows if r["sessions"] == 50}
    out = ["| build | glue | sessions | grown turns | without a count | ratio to 50 | "
           "evictions | evicted recounts | heap allocated | heap size | RSS |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        b = base.get((r["label"], r["glue"]))
        ratio = f"{r['share'] / b:.3f}" if b else "—"
        na = lambda v: "—" if v is None else str(v)  # noqa: E731
        out.append(f"| {r['label']} | {r['glue']} | {r['sessions']:,} | {r['grown']:,} | "
                   f"{100 * r['share']:.1f} % | {ratio} | {na(r['evictions'])} | "
                   f"{na(r['evicted_recounts'])} | {mib(r['heap_allocated_growth'])} MiB | "
                   f"{mib(r['heap_size_growth'])} MiB | {mib(r['rss_growth'])} MiB |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glue", choices=("wasm", "module"), default="wasm")
    ap.add_argument("--sessions", type=int, nargs="+", default=[50, 1000, 5000, 20000])
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--filter-config", default="{}",
                    help="JSON object merged into the shipped plugin configuration")
    ap.add_argument("--label", default="", help="names the build in the rows (e.g. 'before')")
    ap.add_argument("--jsonl", default=str(Path(__file__).with_name("results-interleaved.jsonl")))
    ap.add_argument("--markdown", metavar="FILE",
                    help="write the table of the rows in --jsonl to FILE and run nothing")
    args = ap.parse_args()
    if args.markdown:
        Path(args.markdown).write_text(markdown(args.jsonl), encoding="utf-8")
        return
    extra = json.loads(args.filter_config)
    with tempfile.TemporaryDirectory(prefix="interleaved-") as tmp:
        for n in args.sessions:
            row = run_one(args.glue, n, args.turns, extra, Path(tmp) / str(n))
            row["label"] = args.label
            print(json.dumps({k: v for k, v in row.items() if k != "sources_by_turn"}), flush=True)
            with open(args.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
