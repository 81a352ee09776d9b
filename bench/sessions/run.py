#!/usr/bin/env python3
"""Replays agent sessions against a real vLLM, straight and through Envoy + incontext.

    run.py --vllm-port P --work DIR [--turns N] [--out bench/sessions/results.md]

Four paths, each with its own conversation (its own prefix-cache entries on the server),
interleaved turn by turn in a rotating order so drift hits all alike:
  direct  straight to vLLM, with the cap the exact count leads to (what the filter would write)
  envoy   the same Envoy without the filter, with that cap (what Envoy alone costs)
  count   Envoy + incontext as before: every turn counted on the request's path
  skip    Envoy + incontext with `skip_count`: the count is skipped where a bound proves the
          caller's cap fits, and made after the upstream answered instead
Each request is streamed; TTFT is the time to the first event that carries generated text,
after which the client closes the stream (the server aborts the rest). Before each turn the
bench asks vLLM itself for the exact count (its /tokenize or /v1/messages/count_tokens) and
checks that both filtered paths reach the outcome that count leads to.
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import sessions  # noqa: E402

MODEL = "qwen3-tiny"
W = 40960
B = 16000
R = 4096
CLK = os.sysconf("SC_CLK_TCK")
DIALECTS = {"openai": "OpenAI chat with tools",
            "anthropic": "Anthropic Messages, tool_use / tool_result",
            "openai-reasoning_content": "OpenAI chat with tools, `reasoning_content` on every "
                                        "assistant turn",
            "openai-reasoning": "OpenAI chat with tools, `reasoning` on every assistant turn",
            "anthropic-thinking": "Anthropic Messages, a `thinking` block on every assistant turn"}


def api(dialect):
    """The API a session dialect speaks: "openai" or "anthropic"."""
    return dialect.split("-")[0]


def cpu_s(pid):
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def tree_cpu_s(pid):
    """CPU seconds of vLLM's API server and its children (the engine core)."""
    total = cpu_s(pid)
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    for c in children:
        try:
            total += cpu_s(c)
        except OSError:
            pass
    return total


def settle(pid, minimum):
    """Waits `minimum` seconds, then until vLLM is idle (no CPU over 0.2 s, at most 10 s): an
    aborted stream or a count after the upstream answered must not slow the next request."""
    time.sleep(minimum)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        before = tree_cpu_s(pid)
        time.sleep(0.2)
        if tree_cpu_s(pid) - before <= 0.02:
            return


def post_json(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = json.dumps(body).encode()
    conn.request("POST", path, data, {"content-type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {out[:300]!r}")
    return json.loads(out)


def as_chat_renders(messages):
    """The messages as vLLM's chat endpoint gives them to the template: an assistant turn's
    `reasoning_content` as `reasoning` (its `/tokenize` leaves `reasoning_content` out)."""
    out = []
    for m in messages:
        m = dict(m)
        if "reasoning_content" in m and m.get("reasoning") is None:
            m["reasoning"] = m.pop("reasoning_content")
        out.append(m)
    return out


def exact_count(port, dialect, body):
    """vLLM's own count of this request, and how long the server took for it."""
    t0 = time.perf_counter()
    if api(dialect) == "openai":
        reply = post_json(port, "/tokenize", {"model": body["model"],
                                              "messages": as_chat_renders(body["messages"]),
                                              "tools": body["tools"]})
        n = reply["count"]
    else:
        req = {k: body[k] for k in ("model", "system", "messages", "tools")}
        n = post_json(port, "/v1/messages/count_tokens", req)["input_tokens"]
    return n, (time.perf_counter() - t0) * 1000


def expected_cap(p, cap):
    """The cap the exact count leads to (docs/spec.md §2), or None: passes unchanged."""
    value = min(W - p, cap)
    return value if value >= min(R, cap) else None


# Stream events that carry the answer's first token: Anthropic, Responses; a chat chunk's delta.
TOKEN_EVENTS = ("content_block_delta", "response.output_text.delta",
                "response.reasoning_text.delta", "response.function_call_arguments.delta")
TOKEN_DELTAS = ("content", "reasoning_content", "reasoning", "tool_calls")


class SseTokens:
    """Reads an SSE stream chunk by chunk until an event carries a token."""

    def __init__(self):
        self.buf = b""

    def feed(self, chunk) -> bool:
        """Whether the stream so far holds an event with a token."""
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return False
            event = json.loads(payload)
            if event.get("type", "") in TOKEN_EVENTS:
                return True
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if any(delta.get(k) for k in TOKEN_DELTAS):
                    return True
        return False


def first_token(port, path, body, headers=None):
    """(TTFT ms, response headers) of a streamed request (with `headers` besides its
    content-type); the stream is closed after it."""
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.connect()
    t0 = time.perf_counter()
    conn.request("POST", path, data, {"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    if resp.status != 200:
        text = resp.read()
        conn.close()
        raise RuntimeError(f"{path} on {port}: HTTP {resp.status}: {text[:300]!r}")
    lines = SseTokens()
    ttft = None
    while ttft is None:
        chunk = resp.read1(65536)
        if not chunk:
            break
        if lines.feed(chunk):
            ttft = time.perf_counter() - t0
    conn.close()
    if ttft is None:
        raise RuntimeError(f"{path} on {port}: the stream ended without a token")
    return ttft * 1000, headers


def filter_cap(headers, cap):
    """The cap the filter sent upstream (None: unchanged for lack of room), from its headers."""
    action = headers.get("x-incontext-action", "")
    if action == "rewritten":
        return int(headers["x-incontext-max-tokens"])
    if action == "unchanged:fits":
        return cap
    if action == "unchanged:insufficient":
        return None
    raise RuntimeError(f"unexpected x-incontext-action {action!r}")


def outcome_ok(headers, want):
    """Whether the filter reached the outcome the exact count leads to (`want`: that cap, None:
    unchanged for lack of room): the same cap, or a cap written from a bound, which is never
    above the exact one and at most 64 below it (docs/spec.md §15a)."""
    got = filter_cap(headers, B)
    if (headers.get("x-incontext-action"), headers.get("x-incontext-source")) == ("rewritten",
                                                                                  "bound"):
        return want is not None and want - 64 <= got <= want
    return got == want


def stats(admin):
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    conn.request("GET", "/stats?filter=incontext")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        name = name.rsplit(".", 1)[-1]
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def prometheus_histogram(admin):
    conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    conn.request("GET", "/stats/prometheus")
    text = conn.getresponse().read().decode()
    conn.close()
    return [line for line in text.splitlines() if "incontext_count_ms" in line
            and not line.startswith("#")]


def conversations(dialect, names, tag, turns, seed):
    """The API path of `dialect` and one conversation (its request bodies) per name, each its
    own (its own prefix-cache entries on the server)."""
    openai = api(dialect) == "openai"
    path = "/v1/chat/completions" if openai else "/v1/messages"
    make = sessions.openai_session if openai else sessions.anthropic_session
    # The member of a chat turn that carries its reasoning; any for an Anthropic thinking block.
    reasoning = dialect.split("-", 1)[1] if "-" in dialect else None
    return path, {name: make(MODEL, f"{name}-{dialect}-{seed}-{tag}", turns, seed, B, reasoning)
                  for name in names}


def planned(port, dialect, body, capped):
    """(body to send, P, ms of the server's count, the cap the exact count leads to): vLLM's own
    count of the turn, asked before it is sent; `capped`: send that cap (a path without the
    filter) instead of the caller's."""
    p, count_ms = exact_count(port, dialect, body)
    want = expected_cap(p, B)
    if want is None:
        raise RuntimeError(f"no room for R ({p} tokens); shorten the session")
    sent = dict(body)
    if capped:
        sent["max_tokens"] = want
    return sent, p, count_ms, want


def replay(args, dialect, pid, seed):
    path, convs = conversations(dialect, ("direct", "envoy", "count", "skip"), args.run_id,
                                args.turns, seed)
    ports = {"direct": args.vllm_port, "envoy": args.envoy_port, "count": args.count_port,
             "skip": args.skip_port}
    order = ["direct", "envoy", "count", "skip"]
    rows = []
    for t in range(args.turns):
        row = {"dialect": dialect, "session": seed, "turn": t + 1}
        for name in order[t % 4:] + order[:t % 4]:
            sent, p, count_ms, want = planned(args.vllm_port, dialect, convs[name][t],
                                              name in ("direct", "envoy"))
            settle(pid, args.settle)
            tails0 = stats(args.skip_admin).get("incontext_tail_counts", 0) if name == "skip" else 0
            cpu0 = cpu_s(pid)
            ttft, headers = first_token(ports[name], path, sent)
            settle(pid, args.settle)  # the server aborts the stream; an off-path count ends
            row[f"cpu_{name}_ms"] = (cpu_s(pid) - cpu0) * 1000
            row[f"ttft_{name}"] = ttft
            row[f"p_{name}"] = p
            if name == "direct":
                row["P"] = p
                row["count_ms"] = count_ms
                continue
            if name == "envoy":
                continue
            row[f"ok_{name}"] = outcome_ok(headers, want)
            row[f"source_{name}"] = headers.get("x-incontext-source")
            row[f"action_{name}"] = headers.get("x-incontext-action")
            row[f"phi_{name}"] = int(headers.get("x-incontext-prompt-tokens", "0"))
            if name == "skip":
                # A count of the turn's new messages alone was made on its path.
                row["tail_skip"] = stats(args.skip_admin).get("incontext_tail_counts", 0) > tails0
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def summary(rows):
    fits = [r for r in rows if W - r["P"] >= B]
    long = [r for r in rows if r["P"] >= 8000]
    long_fits = [r for r in fits if r["P"] >= 8000]
    long_skipped = [r for r in long_fits if r["source_skip"] == "bound"]
    long_tailed = [r for r in long_fits if r.get("tail_skip")]

    def ratio(rs, name):
        return median([r[f"ttft_{name}"] / r["ttft_direct"] for r in rs])

    def added(rs, name):
        return median([r[f"ttft_{name}"] - r["ttft_direct"] for r in rs])

    def calls(rs, name):
        return sum(1 for r in rs if r[f"source_{name}"] == "exact")

    return {
        "turns": len(rows),
        "sessions": len({r["session"] for r in rows}),
        "P": (min(r["P"] for r in rows), max(r["P"] for r in rows)),
        "fits": len(fits),
        "skipped_fits": sum(1 for r in fits if r["source_skip"] == "bound"),
        "nocall_fits": sum(1 for r in fits if r["source_skip"] == "bound" and not r.get("tail_skip")),
        "tail_fits": sum(1 for r in fits if r.get("tail_skip")),
        "tail_turns": sum(1 for r in rows if r.get("tail_skip")),
        "n_long_tailed": len(long_tailed),
        "ratio_skip_long_tailed": ratio(long_tailed, "skip"),
        "ratio_envoy_long_tailed": ratio(long_tailed, "envoy"),
        "calls_count": calls(rows, "count"),
        "calls_skip": calls(rows, "skip"),
        "ok": all(r["ok_count"] and r["ok_skip"] for r in rows),
        "ratio_envoy_long_fits": ratio(long_fits, "envoy"),
        "ratio_envoy_long": ratio(long, "envoy"),
        "ratio_count_long_fits": ratio(long_fits, "count"),
        "ratio_skip_long_fits": ratio(long_fits, "skip"),
        "ratio_count_long": ratio(long, "count"),
        "ratio_skip_long": ratio(long, "skip"),
        "added_envoy_long": added(long, "envoy"),
        "added_count_long": added(long, "count"),
        "added_skip_long": added(long, "skip"),
        "n_long_fits": len(long_fits),
        "n_long_skipped": len(long_skipped),
        "ratio_envoy_long_skipped": ratio(long_skipped, "envoy"),
        "ratio_count_long_skipped": ratio(long_skipped, "count"),
        "ratio_skip_long_skipped": ratio(long_skipped, "skip"),
        "n_long": len(long),
        "count_ms_median": median([r["count_ms"] for r in rows]),
        "count_ms_max": max(r["count_ms"] for r in rows),
        "cpu_direct": sum(r["cpu_direct_ms"] for r in rows) / 1000,
        "cpu_envoy": sum(r["cpu_envoy_ms"] for r in rows) / 1000,
        "cpu_count": sum(r["cpu_count_ms"] for r in rows) / 1000,
        "cpu_skip": sum(r["cpu_skip_ms"] for r in rows) / 1000,
        "count_s": sum(r["count_ms"] for r in rows) / 1000,
    }


def markdown(all_rows, sums, env, hist, sessions_per):
    out = ["# Agent sessions: TTFT straight to vLLM and through Envoy + incontext", "",
           f"Generated by `bench/sessions/run.sh` ({env}). W = {W} (vLLM `--max-model-len`, "
           f"prefix caching on), B = {B} (`max_tokens` of every turn), R = {R}; streamed; "
           "each path its own conversation and prefix cache; `envoy`: the same Envoy without the "
           "filter; `count`: incontext counting every "
           "turn on the request's path; `skip`: with `skip_count: true` (no count where the "
           "bytes of a turn's new messages prove its cap fits; where they do not, those messages "
           "counted alone, `(tail)`, before the whole prompt). Each turn waits until "
           "vLLM is idle before it is sent. Sessions per dialect: " + str(sessions_per) + ".", "",
           "| session | turns (sessions) | P | turns with W − P ≥ B | of those, no count call (skip) "
           "| of those, only their new messages counted (skip) "
           "| whole-prompt counts on the path: count / skip | median TTFT ratio, P ≥ 8000 and W − P ≥ B: "
           "envoy / count / skip | median TTFT ratio, P ≥ 8000: envoy / count / skip "
           "| median added ms, P ≥ 8000: envoy / count / skip | outcome = exact-count outcome |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for dialect, s in sums.items():
        name = DIALECTS[dialect]
        out.append(
            f"| {name} | {s['turns']} ({s['sessions']}) | {s['P'][0]}–{s['P'][1]} | {s['fits']} | "
            f"{s['nocall_fits']} ({100 * s['nocall_fits'] / max(1, s['fits']):.0f} %) | "
            f"{s['tail_fits']} ({100 * s['tail_fits'] / max(1, s['fits']):.0f} %) | "
            f"{s['calls_count']} / {s['calls_skip']} | "
            f"{s['ratio_envoy_long_fits']:.3f} / {s['ratio_count_long_fits']:.3f} / "
            f"{s['ratio_skip_long_fits']:.3f} ({s['n_long_fits']} turns) | "
            f"{s['ratio_envoy_long']:.3f} / {s['ratio_count_long']:.3f} / "
            f"{s['ratio_skip_long']:.3f} ({s['n_long']} turns) | "
            f"{s['added_envoy_long']:+.1f} / {s['added_count_long']:+.1f} / "
            f"{s['added_skip_long']:+.1f} | "
            f"{'every turn' if s['ok'] else 'NO'} |")
    out += ["", "Over the turns the `skip` proxy skipped (P ≥ 8000), median TTFT ratio "
            "envoy / count / skip: " + "; ".join(
                f"{d}: {s['ratio_envoy_long_skipped']:.3f} / {s['ratio_count_long_skipped']:.3f} / "
                f"{s['ratio_skip_long_skipped']:.3f} ({s['n_long_skipped']} turns)"
                for d, s in sums.items()) + "."]
    out += ["", "Over the turns whose cap a count of their new messages alone proved (P ≥ 8000), "
            "median TTFT ratio envoy / skip: " + "; ".join(
                f"{d}: {s['ratio_envoy_long_tailed']:.3f} / {s['ratio_skip_long_tailed']:.3f} "
                f"({s['n_long_tailed']} turns)" for d, s in sums.items()) + "."]
    out += ["", "vLLM's own count of these conversations (the bench's exact count, straight to "
            "the server): " + "; ".join(
                f"{d}: median {s['count_ms_median']:.0f} ms, up to {s['count_ms_max']:.0f} ms"
                for d, s in sums.items()) + ".",
            "vLLM API-server CPU over the whole session (seconds, each request plus the counts "
            "the filter made for it, on or off its path; 10 ms clock ticks): " + "; ".join(
                f"{d}: direct {s['cpu_direct']:.2f}, envoy {s['cpu_envoy']:.2f}, "
                f"count {s['cpu_count']:.2f}, "
                f"skip {s['cpu_skip']:.2f} (the bench's own counts of the session took "
                f"{s['count_s']:.2f} s of server time)" for d, s in sums.items()) + ".", ""]
    if hist:
        out += ["The count call's duration as Envoy reports it (`skip` proxy, "
                "`/stats/prometheus`):", "", "```"] + hist + ["```", ""]
    out += ["## Every turn", "",
            "| session | turn | P | TTFT direct ms | envoy ms | count ms | skip ms | skip: source, "
            "P reported | server count ms |", "|---|--:|--:|--:|--:|--:|--:|---|--:|"]
    for r in all_rows:
        out.append(f"| {r['dialect']} {r['session']} | {r['turn']} | {r['P']} | {r['ttft_direct']:.0f} | "
                   f"{r['ttft_envoy']:.0f} | "
                   f"{r['ttft_count']:.0f} | {r['ttft_skip']:.0f} | {r['source_skip']}"
                   f"{' (tail)' if r.get('tail_skip') else ''} "
                   f"{r['phi_skip']} | {r['count_ms']:.0f} |")
    return "\n".join(out) + "\n"


def write_results(args, rows, report, bad, violations):
    """Writes the rows (JSON lines, --jsonl) and the report (--out); 1 when an outcome differed
    from the one the exact count leads to (`bad`: the dialects) or a bound was violated."""
    with open(args.jsonl, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(report)
    if bad or violations:
        print(f"FAIL: outcomes differ from the exact count's in {bad} or bound violations",
              file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-port", type=int, required=True)
    ap.add_argument("--count-port", type=int, required=True)
    ap.add_argument("--skip-port", type=int, required=True)
    ap.add_argument("--envoy-port", type=int, required=True)
    ap.add_argument("--skip-admin", type=int, required=True)
    ap.add_argument("--count-admin", type=int, required=True)
    ap.add_argument("--vllm-pid", type=int, required=True)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=2, help="sessions per dialect (seeds)")
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--dialects", default="openai,anthropic")
    ap.add_argument("--run-id", default=str(int(time.time())))
    ap.add_argument("--env", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jsonl", required=True)
    args = ap.parse_args()
    all_rows, sums = [], {}
    for dialect in args.dialects.split(","):
        rows = []
        for seed in range(args.seed, args.seed + args.sessions):
            rows += replay(args, dialect, args.vllm_pid, seed)
        all_rows += rows
        sums[dialect] = summary(rows)
        print(json.dumps({dialect: sums[dialect]}), flush=True)
    counters = {"count": stats(args.count_admin), "skip": stats(args.skip_admin)}
    print(json.dumps(counters), flush=True)
    hist = prometheus_histogram(args.skip_admin)
    report = (markdown(all_rows, sums, args.env, hist, args.sessions)
              + "\nThe filters' counters at the end of the run: `count` "
              + json.dumps(counters["count"], sort_keys=True) + "; `skip` "
              + json.dumps(counters["skip"], sort_keys=True) + ".\n")
    return write_results(args, all_rows, report, [d for d, s in sums.items() if not s["ok"]],
                         counters["skip"].get("incontext_bound_violations", 0))


if __name__ == "__main__":
    sys.exit(main())
