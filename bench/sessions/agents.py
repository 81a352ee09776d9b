#!/usr/bin/env python3
"""Replays the real agents' recorded conversations (bench/sessions/recorded, written by
record.py: Claude Code, Codex CLI, OpenCode, Qwen Code, eight turns each) against a real vLLM,
straight, through Envoy alone and through Envoy + incontext, and reports per agent how many of
the later turns went upstream without a whole count on their path, the time to first token and
the vLLM API server's CPU of each path.

    agents.py --vllm-port P --vllm-pid PID --envoy BIN --wasm WASM --work DIR
              [--rounds 2] [--agents claude,codex,opencode,qwen] --out FILE.md --jsonl FILE

vLLM must serve `qwen3-tiny` with a window C (GET /v1/models) of at least 65536 (so every
agent's cap fits beside its prompt), `--enable-scale-out` (Codex's Responses requests are
counted by /v1/responses/render), `VLLM_SERVER_DEV_MODE=1` (POST /reset_prefix_cache) and
`--override-generation-config '{"max_new_tokens": 16}'` (the random-weight model never ends an
answer: every answer ends after 16 tokens, whatever its cap, so each stream is read to its end
and its usage reaches the filter, as an agent's does); run.sh's `agents` mode starts it so.

Two windows, each its own pass of every agent's conversation on every path:
  fit   W = C: every turn whose cap fits (W − P ≥ B; Codex sends none) goes as recorded
  band  W = 24576 (`window_tokens`): every cap must be rewritten to W − P
Paths:
  direct     straight to vLLM, the body the exact count leads to: the recorded bytes where the
             cap fits, else the same bytes with the cap member's value replaced (Codex: a
             `max_output_tokens` member first), as the filter writes it
  envoy      the same bodies through Envoy without the filter
  incontext  the recorded bytes, as they stand, through Envoy + incontext: envoy/envoy.yaml's
             plugin configuration with `context_length` C (and `window_tokens` in the band
             pass); a fresh Envoy for each conversation, so nothing is remembered across passes
Before each pass vLLM's prefix cache is emptied, so each path's conversation meets the cache its
own earlier turns left, as the agent's would; the paths go in a rotating order, round by round.
Every body is the recorded one byte for byte but for that cap. vLLM's own count of each request
is asked once before the run; the incontext outcome must be the one it leads to.
"""

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import proxies  # noqa: E402
import record  # noqa: E402
from run import SseTokens, cpu_s, settle, stats  # noqa: E402

AGENTS = ("claude", "codex", "opencode", "qwen")
NAMES = {"claude": "Claude Code 2.1.328", "codex": "Codex CLI 0.169.0",
         "opencode": "OpenCode 1.18.33", "qwen": "Qwen Code 0.24.4"}
BAND_W = 24576
PATHS = ("direct", "envoy", "incontext")
CAPS = {"/v1/messages": ("max_tokens",),
        "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
        "/v1/responses": ("max_output_tokens",)}
R = 4096        # envoy/envoy.yaml's min_output_tokens


def load(agent):
    return record.load(os.path.join(HERE, "recorded", f"{agent}.jsonl.gz"))


def route(path):
    bare = path.split("?", 1)[0]
    return next(r for r in CAPS if bare.endswith(r))


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, json.dumps(body).encode() if body is not None else b"",
                 {"content-type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {out[:300]!r}")
    return json.loads(out) if out.strip() else None


def exact(port, path, body):
    """vLLM's own count of the request."""
    kind = route(path)
    if kind == "/v1/messages":
        req = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        return post(port, "/v1/messages/count_tokens", req)["input_tokens"]
    if kind == "/v1/chat/completions":
        req = {k: body[k] for k in ("model", "messages", "tools") if k in body}
        return post(port, "/tokenize", req)["count"]
    req = {k: v for k, v in body.items() if k not in ("max_output_tokens", "stream")}
    return len(post(port, "/v1/responses/render", req)["token_ids"])


def cap_of(path, body):
    for name in CAPS[route(path)]:
        if isinstance(body.get(name), int):
            return name, body[name]
    return None, None


def wanted(p, b, w):
    """The cap the exact count leads to (docs/spec.md §2, min_output_tokens R), or None."""
    value = w - p if b is None else min(w - p, b)
    return value if value >= (R if b is None else min(R, b)) else None


def body_for(record, body, name, b, want, w, c):
    """The bytes the paths without the filter send: the recorded ones where the cap fits (no
    cap: only where W = C, vLLM then takes C − P itself), else with `want` as the cap."""
    raw = record["body"].encode("utf-8")
    if want is None:
        raise RuntimeError(f"{record['agent']} #{record['seq']}: no room for R at W = {w}")
    if (b is not None and want == b) or (b is None and w == c):
        return raw
    if compact(body).encode("utf-8") != raw:
        raise RuntimeError(f"{record['agent']} #{record['seq']}: the body is not compact JSON")
    if name is not None:
        out = dict(body)
        out[name] = want
    else:
        out = {"max_output_tokens": want, **body}
    return compact(out).encode("utf-8")


def stream(port, record, data):
    """(TTFT ms, response headers): the request sent, its stream read to its end."""
    headers = dict(record["headers"])
    headers["content-length"] = str(len(data))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.connect()
    t0 = time.perf_counter()
    conn.request(record["method"], record["path"], data, headers)
    resp = conn.getresponse()
    head = {k.lower(): v for k, v in resp.getheaders()}
    if resp.status != 200:
        text = resp.read()
        conn.close()
        raise RuntimeError(f"{record['agent']} #{record['seq']} on {port}: HTTP {resp.status}: "
                           f"{text[:300]!r}")
    ttft, lines = None, SseTokens()
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        if ttft is None and lines.feed(chunk):
            ttft = time.perf_counter() - t0
    conn.close()
    if ttft is None:
        raise RuntimeError(f"{record['agent']} #{record['seq']} on {port}: no token")
    return ttft * 1000, head


def filter_cap(head, b, p, c):
    action = head.get("x-incontext-action")
    if action == "rewritten":
        return int(head["x-incontext-max-tokens"])
    if action == "unchanged:fits":
        return b if b is not None else c - p
    if action == "unchanged:insufficient":
        return None
    return action


class Envoys:
    """Envoy alone (one for the run) and Envoy + incontext (a fresh one per conversation)."""

    def __init__(self, args, c):
        self.args, self.c = args, c
        self.shipped = proxies.shipped()
        self.plain = (args.port_base + 2, args.port_base + 12)
        self.filtered = (args.port_base, args.port_base + 10)
        self.procs = {}

    def start(self, name, listener, extra, with_filter):
        port, admin = listener
        cfg = proxies.bench_render.proxy(self.shipped, self.args.wasm, port, admin,
                                         self.args.vllm_port, extra, with_filter)
        path = os.path.join(self.args.work, f"agents-{name}.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(cfg, f, sort_keys=False)
        proc = subprocess.Popen(
            [self.args.envoy, "-c", path, "--concurrency", "2", "--disable-hot-restart",
             "-l", "warn", "--log-path", os.path.join(self.args.work, f"agents-{name}.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not proxies.ready(admin):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Envoy {name} not ready (see {self.args.work})")
            time.sleep(0.1)
        self.procs[name] = proc

    def stop(self, name):
        proc = self.procs.pop(name, None)
        if proc and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self):
        for name in list(self.procs):
            self.stop(name)


def passes(args, c, agent, records, counts, envoys, window, rnd, order):
    """One conversation of `agent` on each path at window `window`: a row per request."""
    rows = [{"agent": agent, "window": window, "round": rnd, "turn": r["turn"], "seq": r["seq"],
             "P": counts[r["seq"]]} for r in records]
    for path in order:
        post(args.vllm_port, "/reset_prefix_cache", None)
        if path == "incontext":
            extra = {"context_length": c}
            if window != c:
                extra["window_tokens"] = window
            envoys.start("incontext", envoys.filtered, extra, True)
        port = {"direct": args.vllm_port, "envoy": envoys.plain[0],
                "incontext": envoys.filtered[0]}[path]
        try:
            for row, record in zip(rows, records):
                body = json.loads(record["body"])
                name, b = cap_of(record["path"], body)
                p = row["P"]
                want = wanted(p, b, window)
                row["B"], row["want"] = b, want
                row["fits"] = (b is None and window == c) or (b is not None and window - p >= b)
                data = (record["body"].encode("utf-8") if path == "incontext"
                        else body_for(record, body, name, b, want, window, c))
                settle(args.vllm_pid, args.settle)
                before = stats(envoys.filtered[1]) if path == "incontext" else {}
                cpu0 = cpu_s(args.vllm_pid)
                ttft, head = stream(port, record, data)
                settle(args.vllm_pid, args.settle)
                row[f"cpu_{path}_ms"] = (cpu_s(args.vllm_pid) - cpu0) * 1000
                row[f"ttft_{path}"] = ttft
                if path == "incontext":
                    after = stats(envoys.filtered[1])
                    got = filter_cap(head, b, p, c)
                    source = head.get("x-incontext-source")
                    reported = int(head.get("x-incontext-prompt-tokens", "-1"))
                    if head.get("x-incontext-action") == "rewritten" and source == "bound":
                        ok = want is not None and want - 64 <= got <= want
                    else:
                        ok = got == want
                    ok = ok and (reported >= p if source == "bound" else reported == p)
                    row.update(action=head.get("x-incontext-action"), source=source,
                               reported=reported, sent=got, ok=ok,
                               tail=after.get("incontext_tail_counts", 0)
                               > before.get("incontext_tail_counts", 0),
                               whole=after.get("incontext_count_calls", 0)
                               - before.get("incontext_count_calls", 0))
            if path == "incontext":
                row0 = rows[0]
                row0["counters"] = stats(envoys.filtered[1])
        finally:
            if path == "incontext":
                envoys.stop("incontext")
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "counters"}), flush=True)
    return rows


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def summary(rows):
    later = [r for r in rows if r["turn"] >= 2]

    def ratio(rs, a, b):
        return median([r[f"ttft_{a}"] / r[f"ttft_{b}"] for r in rs])

    fits = [r for r in later if r["fits"]]
    band = [r for r in later if not r["fits"]]
    cpu = {p: sum(r[f"cpu_{p}_ms"] for r in rows) / 1000 for p in PATHS}
    checks = {}
    for r in rows:
        for k, v in (r.get("counters") or {}).items():
            checks[k] = checks.get(k, 0) + v
    return {
        "later": len(later), "bound": sum(1 for r in later if r["source"] == "bound"),
        "tail": sum(1 for r in later if r["tail"]),
        "whole_later": sum(r["whole"] for r in later),
        "n_fits": len(fits), "n_band": len(band),
        "fit_direct": ratio(fits, "incontext", "direct"),
        "fit_envoy": ratio(fits, "incontext", "envoy"),
        "fit_envoy_direct": ratio(fits, "envoy", "direct"),
        "band_direct": ratio(band, "incontext", "direct"),
        "band_envoy": ratio(band, "incontext", "envoy"),
        "band_envoy_direct": ratio(band, "envoy", "direct"),
        "cpu": cpu, "cpu_direct": cpu["incontext"] / cpu["direct"],
        "cpu_envoy": cpu["incontext"] / cpu["envoy"],
        "P": (min(r["P"] for r in rows), max(r["P"] for r in rows)),
        "ok": all(r["ok"] for r in rows), "checks": checks,
        "ttft_direct_median": median([r["ttft_direct"] for r in later]),
    }


def fmt(x):
    return "–" if x != x else f"{x:.3f}"


def markdown(args, c, sums, rows):
    out = ["# The real agents' own traffic: TTFT and vLLM CPU straight, through Envoy alone and "
           "through Envoy + incontext", "",
           f"Generated by `bench/sessions/run.sh agents` ({args.env}; rounds: {args.rounds}; "
           f"wasm: {args.wasm_label or args.wasm}). The recorded conversations of "
           "bench/sessions/recorded (eight turns of each agent, continued with its own "
           "`--continue` / `resume`; bench/sessions/record.py), replayed byte for byte: "
           f"vLLM 0.32 window C = {c}, every answer ended after 16 tokens by vLLM "
           "(`max_new_tokens`) and read to its end; the prefix cache emptied before each "
           "conversation; incontext with envoy/envoy.yaml's plugin configuration "
           f"(R 4096, skipping on) and `context_length` {c}. Two passes: **fit**, W = C, "
           "every cap fits beside the prompt (Codex sends none) and goes as recorded (Claude "
           "Code's one retry with `max_tokens` 128000 apart); **band**, `window_tokens` "
           f"{BAND_W}, every cap rewritten to W − P (straight and through Envoy alone: the "
           "recorded bytes with that cap). TTFT ratios: medians over the turns 2.. of each "
           "conversation, per turn against the same turn on the other path in the same round; "
           "CPU: vLLM's API-server process over every request of the pass (10 ms ticks).", "",
           "| agent | window | P | turns 2.. without a whole count on the path (of those, new "
           "messages counted) | whole counts on the path, turns 2.. | median TTFT ratio "
           "incontext / direct · incontext / envoy · envoy / direct | vLLM API CPU s: direct / "
           "envoy / incontext (ratio to direct · to envoy) | outcome = exact count's |",
           "|---|---|--:|--:|--:|--:|--:|---|"]
    for (agent, window), s in sums.items():
        kind = "fit" if window == c else "band"
        if kind == "fit":
            ratios = (f"{fmt(s['fit_direct'])} · {fmt(s['fit_envoy'])} · "
                      f"{fmt(s['fit_envoy_direct'])} ({s['n_fits']} turns)")
            if s["n_band"]:
                ratios += (f"; its band turns: {fmt(s['band_direct'])} · "
                           f"{fmt(s['band_envoy'])} ({s['n_band']})")
        else:
            ratios = (f"{fmt(s['band_direct'])} · {fmt(s['band_envoy'])} · "
                      f"{fmt(s['band_envoy_direct'])} ({s['n_band']} turns)")
        out.append(
            f"| {NAMES[agent]} | {kind} (W {window}) | {s['P'][0]}–{s['P'][1]} | "
            f"{s['bound']} of {s['later']} ({100 * s['bound'] / max(1, s['later']):.0f} %; "
            f"{s['tail']}) | {s['whole_later']} | {ratios} | "
            f"{s['cpu']['direct']:.2f} / {s['cpu']['envoy']:.2f} / {s['cpu']['incontext']:.2f} "
            f"(×{s['cpu_direct']:.2f} · ×{s['cpu_envoy']:.2f}) | "
            f"{'every turn' if s['ok'] else 'NO'} |")
    out += ["", "The filter's counters over each agent's incontext conversations (summed over "
            "rounds): " + "; ".join(
                f"{a} {'fit' if w == c else 'band'}: " + ", ".join(
                    f"{k} {s['checks'].get('incontext_' + k, 0)}" for k in (
                        "count_calls", "tail_counts", "count_skipped", "usage_checks",
                        "bound_checks", "bound_violations", "usage_mismatch"))
                for (a, w), s in sums.items()) + ".", "",
            "## Every request", "",
            "| agent | window | round | turn | P | B | incontext: action, source, P reported "
            "| TTFT direct / envoy / incontext ms |", "|---|--:|--:|--:|--:|--:|---|---|"]
    for r in rows:
        out.append(f"| {r['agent']} | {r['window']} | {r['round']} | {r['turn']} | {r['P']} | "
                   f"{r['B']} | {r['action']}, {r['source']}{' (tail)' if r['tail'] else ''}, "
                   f"{r['reported']} | {r['ttft_direct']:.0f} / {r['ttft_envoy']:.0f} / "
                   f"{r['ttft_incontext']:.0f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-port", type=int, required=True)
    ap.add_argument("--vllm-pid", type=int, required=True)
    ap.add_argument("--envoy", required=True)
    ap.add_argument("--wasm", required=True)
    ap.add_argument("--wasm-label", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("--port-base", type=int, default=18480)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--agents", default=",".join(AGENTS))
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--env", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--report-only", action="store_true",
                    help="write --out again from the rows of --jsonl (C 65536), nothing sent")
    args = ap.parse_args()
    if args.report_only:
        with open(args.jsonl, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        by = {}
        for r in rows:
            by.setdefault((r["agent"], r["window"]), []).append(r)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(markdown(args, 65536, {k: summary(v) for k, v in by.items()}, rows))
        return 0
    models = json.loads(subprocess.run(
        ["curl", "-sf", f"http://127.0.0.1:{args.vllm_port}/v1/models"], capture_output=True,
        check=True).stdout)
    c = models["data"][0]["max_model_len"]
    if c < 65536:
        raise SystemExit(f"vLLM's window is {c}; start it with a window of 65536 (run.sh agents)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    agents = args.agents.split(",")
    records = {a: load(a) for a in agents}
    counts = {a: {r["seq"]: exact(args.vllm_port, r["path"], json.loads(r["body"]))
                  for r in records[a]} for a in agents}
    envoys = Envoys(args, c)
    all_rows, sums = [], {}
    try:
        envoys.start("envoy", envoys.plain, {}, False)
        by = {}
        for rnd in range(args.rounds):
            for i, agent in enumerate(agents):
                for window in (c, BAND_W):
                    k = rnd + i
                    order = list(PATHS[k % 3:] + PATHS[:k % 3])
                    rows = passes(args, c, agent, records[agent], counts[agent], envoys,
                                  window, rnd + 1, order)
                    by.setdefault((agent, window), []).extend(rows)
                    all_rows += rows
        sums = {key: summary(rows) for key, rows in by.items()}
    finally:
        envoys.stop_all()
    with open(args.jsonl, "w", encoding="utf-8") as f:
        for r in all_rows:
            f.write(json.dumps(r) + "\n")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(markdown(args, c, sums, all_rows))
    for key, s in sums.items():
        print(json.dumps({"agent": key[0], "window": key[1],
                          **{k: v for k, v in s.items() if k != "checks"}}), flush=True)
    bad = [k for k, s in sums.items() if not s["ok"]]
    violations = sum(s["checks"].get("incontext_bound_violations", 0) for s in sums.values())
    if bad or violations:
        print(f"FAIL: outcomes differ from the exact count's in {bad}, or {violations} bound "
              "violations", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
