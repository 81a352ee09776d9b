"""Chaos soak: many requests through the real Envoy + incontext.wasm while the tokenizer flaps.

    .venv/bin/python -m tests.soak.soak [--requests 30000] [--concurrency 32] [--json out.json]
    scripts/soak.sh [requests] [concurrency]

What it does:

* starts ``fake_vllm.py`` (an asyncio echo server and a flapping fake ``/tokenize``, see there)
  in its own process, and one Envoy (``--concurrency 2``, the shipped ``envoy/envoy.yaml``
  rendered by the e2e harness) whose plugin configuration sends ``/tokenize`` to a separate
  ``tokenizer`` cluster with ``timeout_ms`` 200 and ``cache_entries`` 64 (so the count cache
  is full and evicting for most of the run);
* sends N requests over ``concurrency`` keep-alive connections (every 8th one HTTP/2, h2c): chat
  bodies with unique and repeated prompts, various caps (strings, floats, ``1e400``, duplicate
  keys), completions, token-id prompts, and passthrough traffic (GET, not JSON, not an object,
  gzip, completion without a cap);
* checks every answer: 200 from the echo upstream (``x-echo: 1``), and the body the upstream
  got either byte-identical to what was sent or exactly the docs/spec.md rewrite of it (same P as the
  ``x-incontext-prompt-tokens`` header: the scripted count for ``exact``/``cache``, the rough
  estimate for ``estimate``; every non-cap member byte-identical; exactly one cap member;
  Content-Length equal to the body);
* after a warm-up (10 % of the requests) and at the end, with no request in flight, samples
  Envoy's ``/memory`` (``allocated``, tcmalloc) and the process RSS (which includes the wasm
  VMs' linear memory and the shared data), and checks they stay flat;
* checks counters are consistent and that no wasm VM failed or was reloaded
  (``wasm.incontext.vm_reload*``, ``wasm.envoy.wasm.runtime.v8.created``/``active``, the log).

Exit status 0 when everything held; the report is printed (and written with ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import List, Optional

import httpx

from tests.harness.envoy import Envoy, _http_get, envoy_binary
from tests.harness.spec import (CAP_FIELDS, decide, estimate, non_cap_members_kept, rough,
                                rewritten_obj, value_raw)

HERE = Path(__file__).resolve().parent

C = 32768
R = 4096
F = 1024
W = C
MODEL = "soak/model"
TIMEOUT_MS = 200
CACHE_ENTRIES = 64
REPEATED_PROMPTS = 48

BAD_LOG = ("panicked", "Wasm VM failed", "failed: Uncaught", "[critical]", "restricted_callback",
           "Function: proxy_on_")

# The passthrough kinds and the x-incontext-action they must get.
PASSTHROUGH = {
    "get": "unchanged:method",
    "not_json": "unchanged:not_json",
    "not_object": "unchanged:not_object",
    "gzip": "unchanged:encoding",
    "completion_nocap": "unchanged:no_cap",
    "other_model": "unchanged:model",
}
# Kinds counted through the tokenizer (or the cache): one cache lookup each.
TOKENIZED = {"chat_unique", "chat_repeat", "chat_full", "completion"}


def plugin_config() -> dict:
    return {
        "tokenizer": {"cluster": "tokenizer", "authority": "tokenizer:8000",
                      "timeout_ms": TIMEOUT_MS},
        "model": [MODEL],
        "context_length": C,
        "min_output_tokens": R,
        "fallback_margin_tokens": F,
        "cache_entries": CACHE_ENTRIES,
        # The soak drives the count's path under a flapping tokenizer: every budgeted request
        # is counted (or estimated), so its counter identities hold exactly. Skipping, on by
        # default, has its own suites (tests/e2e/test_skip.py, tests/sessions/test_skip.py).
        "skip_count": False,
    }


def tokenizer_cluster(port: int) -> dict:
    return {"name": "tokenizer", "type": "STATIC", "connect_timeout": "0.25s",
            "load_assignment": {"cluster_name": "tokenizer", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": port}}}}]}]}}


# --- the request mix -----------------------------------------------------------------------------
def _cap_tail(rng: random.Random) -> str:
    """Raw JSON text of the cap members to append (may be empty), as a client might send."""
    return rng.choice([
        "", "", "",
        ', "max_tokens": 100000',
        ', "max_tokens": "2048"',
        ', "max_completion_tokens": 9000.0',
        ', "max_tokens": 64',
        ', "max_tokens": 1e400',
        ', "max_tokens": 18446744073709551616',
        ', "max_tokens": 10, "max_tokens": 100000',
        ', "max_tokens": 100000, "max_completion_tokens": "5_000", "max_output_tokens": 3000',
        ', "max_output_tokens": 7000',
        ', "max_tokens": null',
        ', "max_tokens": true',
    ])


def _chat_body(text: str, rng: random.Random) -> bytes:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]
    head = {"model": MODEL, "messages": msgs}
    if rng.random() < 0.3:
        head["temperature"] = round(rng.random(), 2)
    if rng.random() < 0.1:
        head["stream"] = True
    raw = json.dumps(head, ensure_ascii=rng.random() < 0.5)
    return (raw[:-1] + _cap_tail(rng) + "}").encode("utf-8")


def make_cases(n: int, seed: int) -> List[dict]:
    rng = random.Random(seed)
    pool = []
    for j in range(REPEATED_PROMPTS):
        count = rng.randint(1, 26000)
        pool.append(f"repeated prompt {j} count={count} " + "lorem ipsum " * rng.randint(0, 60))
    kinds = (["chat_unique"] * 34 + ["chat_repeat"] * 30 + ["chat_full"] * 5
             + ["completion"] * 8 + ["token_ids"] * 4 + ["get"] * 4 + ["not_json"] * 4
             + ["not_object"] * 3 + ["gzip"] * 4 + ["completion_nocap"] * 3 + ["other_model"] * 2)
    cases = []
    for i in range(n):
        kind = rng.choice(kinds)
        case = {"i": i, "kind": kind, "method": "POST", "path": "/v1/chat/completions",
                "headers": {"content-type": "application/json"}}
        if kind == "get":
            case.update(method="GET", path=f"/v1/models?i={i}", body=None, headers={})
        elif kind == "not_json":
            case["body"] = f"plain text {i} count=5".encode()
        elif kind == "not_object":
            case["body"] = json.dumps([{"role": "user", "content": f"x {i}"}]).encode()
        elif kind == "gzip":
            case["body"] = gzip.compress(_chat_body(f"zipped {i} count=9", rng))
            case["headers"] = {"content-type": "application/json", "content-encoding": "gzip"}
        elif kind == "other_model":
            case["body"] = json.dumps({"model": "other/model", "max_tokens": 100000, "messages": [
                {"role": "user", "content": f"not ours {i} count=3"}]}).encode()
        elif kind == "completion_nocap":
            case["path"] = "/v1/completions"
            case["body"] = json.dumps({"model": MODEL, "prompt": f"story {i} count=7"}).encode()
        elif kind == "completion":
            case["path"] = "/v1/completions"
            count = rng.randint(1, 30000)
            cap = rng.choice([16, 100000, "512", 3000.0])
            case["body"] = json.dumps({"model": MODEL, "prompt": f"story {i} count={count} "
                                       + "once " * rng.randint(0, 100), "max_tokens": cap}
                                      ).encode()
            case["count"] = count
        elif kind == "token_ids":
            case["path"] = "/v1/completions"
            ids = [rng.randint(0, 150000) for _ in range(rng.randint(1, 2000))]
            case["body"] = json.dumps({"model": MODEL, "prompt": ids,
                                       "max_tokens": rng.choice([100000, 50])}).encode()
            case["count"] = len(ids)
        elif kind == "chat_repeat":
            text = rng.choice(pool)
            case["body"] = _chat_body(text, rng)
            case["count"] = int(text.split("count=")[1].split()[0])
        else:
            count = (rng.randint(W - R - 300, W + 50) if kind == "chat_full"
                     else rng.randint(1, 28000))
            text = f"unique {i} {rng.getrandbits(48):012x} count={count} " + \
                "pad " * rng.randint(0, 200)
            if rng.random() < 0.2:
                text += " 你好世界 café"
            case["body"] = _chat_body(text, rng)
            case["count"] = count
        cases.append(case)
    return cases


# --- checking one answer ---------------------------------------------------------------------
def _cap_members(body: bytes) -> int:
    pairs = json.loads(body, object_pairs_hook=lambda kv: kv)
    return sum(1 for k, _ in pairs if k in CAP_FIELDS)


def check(case: dict, got: dict) -> Optional[str]:
    """None when the answer is right, else what is wrong."""
    where = f"#{case['i']} {case['kind']}"
    if "error" in got:
        return f"{where}: request failed: {got['error']}"
    h = got["headers"]
    if got["status"] != 200:
        return f"{where}: status {got['status']} {h} {got['body'][:200]!r}"
    if h.get("x-echo") != "1":
        return f"{where}: not answered by the echo upstream: {h}"
    up = got["body"]
    if h.get("x-echo-method") != case["method"]:
        return f"{where}: upstream saw method {h.get('x-echo-method')}"
    action = h.get("x-incontext-action")
    sent = case.get("body")
    if sent is None:
        return None if action == "unchanged:method" else f"{where}: action {action}"
    cl = h.get("x-echo-content-length")
    if cl != str(len(up)):
        return f"{where}: upstream content-length {cl} for {len(up)} bytes"
    if case["kind"] in PASSTHROUGH:
        if action != PASSTHROUGH[case["kind"]]:
            return f"{where}: action {action}, expected {PASSTHROUGH[case['kind']]}"
        return None if up == sent else f"{where}: passthrough body changed"
    source = h.get("x-incontext-source")
    try:
        P = int(h.get("x-incontext-prompt-tokens"))
    except (TypeError, ValueError):
        return f"{where}: no prompt count: {h}"
    if source in ("exact", "cache"):
        exact = True
        if case["kind"] == "token_ids" and source != "exact":
            return f"{where}: token ids counted from {source}"
        want_P = case["count"]
    elif source == "estimate" and case["kind"] != "token_ids":
        exact = False
        if case["kind"] == "completion":
            want_P = max(1, rough(value_raw(sent, "prompt")))
        else:
            want_P = estimate(sent)
    else:
        return f"{where}: source {source!r}"
    if P != want_P:
        return f"{where}: prompt tokens {P}, expected {want_P} ({source})"
    obj = json.loads(sent)
    d = decide(obj, P, exact, W=W, C=C, R=R, F=F)
    if not d.rewrite:
        if action != "unchanged:insufficient":
            return f"{where}: action {action}, expected unchanged:insufficient ({d})"
        return None if up == sent else f"{where}: unchanged body differs"
    if action != "rewritten" or h.get("x-incontext-max-tokens") != str(d.value):
        return f"{where}: action {action} max={h.get('x-incontext-max-tokens')}, expected {d}"
    try:
        got_obj = json.loads(up)
    except ValueError:
        return f"{where}: rewritten body is not JSON: {up[:200]!r}"
    if got_obj != rewritten_obj(obj, d):
        return f"{where}: rewritten body {got_obj} != expected {rewritten_obj(obj, d)}"
    if _cap_members(up) != 1:
        return f"{where}: {_cap_members(up)} cap members upstream"
    problems = non_cap_members_kept(sent, up)
    if problems:
        return f"{where}: {problems[:3]}"
    return None


# --- load ------------------------------------------------------------------------------------
KEEP = ("x-echo", "x-echo-method", "x-echo-content-length", "x-incontext-action",
        "x-incontext-source", "x-incontext-prompt-tokens", "x-incontext-max-tokens")


async def drive(url: str, cases: List[dict], concurrency: int, results: list,
                h2_every: int = 8, progress=None):
    """Sends ``cases`` over ``concurrency`` connections (one client each)."""
    it = iter(cases)
    done = [0]

    async def worker(k: int):
        h2 = h2_every > 0 and k % h2_every == h2_every - 1
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits, http1=not h2,
                                     http2=h2) as client:
            for case in it:
                try:
                    r = await client.request(case["method"], case["path"],
                                             content=case.get("body"), headers=case["headers"])
                    results[case["i"]] = {
                        "status": r.status_code, "body": r.content,
                        "headers": {k2: r.headers.get(k2) for k2 in KEEP if k2 in r.headers},
                    }
                except Exception as e:  # a failed request is a soak failure, not a crash
                    results[case["i"]] = {"error": repr(e)}
                done[0] += 1
                if progress and done[0] % 1000 == 0:
                    progress(done[0])

    await asyncio.gather(*(worker(k) for k in range(concurrency)))


# --- observing Envoy -------------------------------------------------------------------------
def memory(envoy: Envoy) -> dict:
    m = envoy.memory()
    return {"allocated": m["allocated"], "heap_size": m["heap_size"], "rss": m["rss"]}


def quiesce(seconds=1.5):
    time.sleep(seconds)


class Soak:
    def __init__(self, requests: int, concurrency: int, *, phase_seconds: float = 2.0,
                 seed: int = 20261130, workdir: Optional[Path] = None, log=print,
                 warmup: Optional[int] = None):
        self.requests = requests
        self.concurrency = concurrency
        self.phase_seconds = phase_seconds
        self.seed = seed
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="incontext-soak-"))
        self.log = log
        self.warmup = warmup if warmup is not None else max(concurrency * 10, requests // 10)
        self.server = None
        self.envoy = None

    def start(self):
        self.server = subprocess.Popen(
            [sys.executable, str(HERE / "fake_vllm.py"), "--phase-seconds",
             str(self.phase_seconds), "--slow-seconds", str(3 * TIMEOUT_MS / 1000),
             "--wait-go"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ports = json.loads(self.server.stdout.readline())
        self.echo_port = ports["echo_port"]
        binary = envoy_binary()
        if not binary:
            raise RuntimeError("Envoy binary not found: run scripts/setup.sh or set ENVOY_BIN")
        self.envoy = Envoy(binary, self.workdir, plugin_config(),
                           ("127.0.0.1", ports["echo_port"]),
                           extra_clusters=[tokenizer_cluster(ports["tokenizer_port"])],
                           name="soak-envoy")
        self.envoy.start()

    def stop(self):
        if self.envoy:
            self.envoy.stop()
        if self.server and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()

    def clock(self, word: str):
        """Run ("go") or stop ("pause") the tokenizer's phase clock: faults only flap under load."""
        self.server.stdin.write(word + "\n")
        self.server.stdin.flush()

    def phases(self) -> dict:
        _, body = _http_get(f"http://127.0.0.1:{self.echo_port}/__phases")
        return json.loads(body)

    def run(self) -> dict:
        cases = make_cases(self.requests, self.seed)
        results: list = [None] * len(cases)
        env = self.envoy
        wasm_start = env.wasm_stats()
        mem_start = memory(env)
        self.clock("go")
        t0 = time.monotonic()

        def progress(n):
            self.log(f"  {self.warmup + n} requests answered ({time.monotonic() - t0:.0f}s)")

        warm = cases[:self.warmup]
        rest = cases[self.warmup:]
        asyncio.run(drive(env.url, warm, self.concurrency, results))
        t_warm = time.monotonic() - t0
        self.clock("pause")
        quiesce()
        mem_warm = memory(env)
        self.log(f"  warm-up: {len(warm)} requests in {t_warm:.1f}s; memory {mem_warm}")
        # the rest in up to 4 segments, memory sampled at rest after each (the trend)
        series = [(len(warm), mem_warm)]
        seg = max(1, -(-len(rest) // 4))
        t_main = 0.0
        for k in range(0, len(rest), seg):
            part = rest[k:k + seg]
            self.clock("go")
            t1 = time.monotonic()
            asyncio.run(drive(env.url, part, self.concurrency, results,
                              progress=lambda n, k=k: progress(k + n)))
            t_main += time.monotonic() - t1
            self.clock("pause")
            quiesce()
            series.append((len(warm) + k + len(part), memory(env)))
        mem_end = series[-1][1]
        duration = t_warm + t_main

        failures = []
        sources = Counter()
        actions = Counter()
        for case, got in zip(cases, results):
            problem = check(case, got) if got is not None else f"#{case['i']}: never sent"
            if problem:
                failures.append(problem)
            elif got:
                actions[got["headers"].get("x-incontext-action")] += 1
                if got["headers"].get("x-incontext-source"):
                    sources[got["headers"]["x-incontext-source"]] += 1

        counters = env.counters()
        wasm_end = env.wasm_stats()
        invariants = self.invariants(cases, counters, sources)
        vm_problems = self.vm_problems(wasm_start, wasm_end)
        mem_problems = self.memory_problems(mem_warm, mem_end)
        phases = self.phases()
        distinct = set()
        for c in cases:
            if c["kind"] in TOKENIZED:
                o = json.loads(c["body"])
                distinct.add(json.dumps(o.get("messages") or o.get("prompt")))
        report = OrderedDict(
            requests=len(cases), concurrency=self.concurrency,
            duration_s=round(duration, 1), rate_per_s=round(len(cases) / duration, 1),
            failures=len(failures), failure_examples=failures[:10],
            actions=dict(actions), sources=dict(sources),
            distinct_prompts=len(distinct), cache_entries=CACHE_ENTRIES,
            counters={k: v for k, v in sorted(counters.items()) if v},
            counter_problems=invariants,
            wasm_start=wasm_start, wasm_end=wasm_end, vm_problems=vm_problems,
            memory_start=mem_start, memory_after_warmup=mem_warm, memory_end=mem_end,
            memory_series=[(n, m["allocated"], m["rss"]) for n, m in series],
            memory_problems=mem_problems,
            tokenizer_phases=Counter(s for _, s in phases["phases"]),
            tokenizer_calls_by_state=phases["calls"],
            echoed=phases["echoed"],
            envoy_log=str(env.log_path),
        )
        report["ok"] = not (failures or invariants or vm_problems or mem_problems)
        return report

    def invariants(self, cases, counters, sources) -> List[str]:
        """Counter identities that must hold for one fresh Envoy."""
        p = []
        n = len(cases)
        kinds = Counter(c["kind"] for c in cases)
        g = counters.get
        unchanged = sum(v for k, v in counters.items() if k.startswith("incontext_unchanged_"))
        failures = sum(v for k, v in counters.items()
                       if k.startswith("incontext_tokenizer_failures_"))
        lookups = sum(kinds[k] for k in TOKENIZED)
        checks = [
            ("requests == sent", g("incontext_requests", 0), n),
            ("rewritten + unchanged + rejected == requests",
             g("incontext_rewritten", 0) + unchanged + g("incontext_rejected", 0), n),
            ("cache hits + misses == tokenizer-counted requests",
             g("incontext_cache_hits", 0) + g("incontext_cache_misses", 0), lookups),
            ("tokenizer_calls == cache misses", g("incontext_tokenizer_calls", 0),
             g("incontext_cache_misses", 0)),
            ("estimates == tokenizer failures", g("incontext_estimates", 0), failures),
            ("estimates == answers with source estimate", g("incontext_estimates", 0),
             sources.get("estimate", 0)),
            ("cache hits == answers with source cache", g("incontext_cache_hits", 0),
             sources.get("cache", 0)),
        ]
        for reason, kind in (("method", "get"), ("not_json", "not_json"),
                             ("not_object", "not_object"), ("encoding", "gzip"),
                             ("no_cap", "completion_nocap"), ("model", "other_model")):
            checks.append((f"unchanged_{reason} == {kind} requests",
                           g(f"incontext_unchanged_{reason}", 0), kinds[kind]))
        for name, got, want in checks:
            if got != want:
                p.append(f"{name}: {got} != {want}")
        for k in ("incontext_unchanged_internal", "incontext_rejected",
                  "incontext_tokenizer_failures_dispatch"):
            if g(k, 0):
                p.append(f"{k} = {g(k)}")
        return p

    def vm_problems(self, start, end) -> List[str]:
        p = self.envoy.vm_failures(start)
        if not self.envoy.alive():
            p.append("envoy exited")
        for line in self.envoy.log_text().splitlines():
            if any(b in line for b in BAD_LOG):
                p.append("log: " + line[:300])
                break
        return p

    @staticmethod
    def memory_problems(warm, end) -> List[str]:
        p = []
        # Flat: what the run after the warm-up added stays within a small allowance (per-
        # connection buffers and allocator slack), far below what a per-request or
        # per-prompt leak would add over tens of thousands of requests.
        for key, allowance in (("allocated", 8 << 20), ("rss", 24 << 20)):
            grew = end[key] - warm[key]
            if grew > allowance:
                p.append(f"{key} grew {grew / 2**20:.1f} MiB after the warm-up "
                         f"({warm[key]} -> {end[key]}; allowance {allowance >> 20} MiB)")
        return p


def human(report: dict) -> str:
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    lines = [
        f"requests:     {report['requests']} at {report['concurrency']} connections",
        f"duration:     {report['duration_s']} s ({report['rate_per_s']} req/s)",
        f"failures:     {report['failures']}",
        f"actions:      {report['actions']}",
        f"sources:      {report['sources']}",
        f"tokenizer:    phases {dict(report['tokenizer_phases'])}; "
        f"calls by state {report['tokenizer_calls_by_state']}",
        f"prompts:      {report['distinct_prompts']} distinct through a cache of "
        f"{report['cache_entries']} entries",
        f"counters:     {report['counters']}",
        f"counter identities: {report['counter_problems'] or 'ok'}",
        f"wasm VMs:     created {report['wasm_end'].get('wasm.envoy.wasm.runtime.v8.created')}, "
        f"active {report['wasm_end'].get('wasm.envoy.wasm.runtime.v8.active')}, "
        f"vm_reload {report['wasm_end'].get('wasm.incontext.vm_reload')}, "
        f"vm_reload_failure {report['wasm_end'].get('wasm.incontext.vm_reload_failure')}"
        f"{'' if not report['vm_problems'] else ' PROBLEMS ' + str(report['vm_problems'])}",
    ]
    for label, key in (("start", "memory_start"), ("after warm-up", "memory_after_warmup"),
                       ("end", "memory_end")):
        m = report[key]
        lines.append(f"memory {label + ':':<14} allocated {mib(m['allocated'])}, "
                     f"heap {mib(m['heap_size'])}, RSS {mib(m['rss'])}")
    lines.append("memory at rest after N requests (allocated / RSS): " + ", ".join(
        f"{n}: {mib(a)} / {mib(r)}" for n, a, r in report["memory_series"]))
    if report["memory_problems"]:
        lines.append(f"memory PROBLEMS: {report['memory_problems']}")
    for f in report["failure_examples"]:
        lines.append("  FAIL " + f[:400])
    lines.append(f"envoy log:    {report['envoy_log']}")
    lines.append("RESULT: " + ("ok" if report["ok"] else "FAILED"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", "-n", type=int, default=30000)
    ap.add_argument("--concurrency", "-c", type=int, default=32)
    ap.add_argument("--phase-seconds", type=float, default=2.0,
                    help="seconds per tokenizer state (up/refused/slow/garbage/503/reset)")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    soak = Soak(args.requests, args.concurrency, phase_seconds=args.phase_seconds,
                seed=args.seed, workdir=args.workdir)
    print(f"soak: {args.requests} requests, {args.concurrency} connections, tokenizer flapping "
          f"every {args.phase_seconds}s; workdir {soak.workdir}", flush=True)
    try:
        soak.start()
        report = soak.run()
    finally:
        soak.stop()
    print(human(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
