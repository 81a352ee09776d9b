#!/usr/bin/env python3
"""Many agent sessions at once against one vLLM, straight and through Envoy + incontext.

    run.sh concurrent [--sessions 8] [--turns 30] [--filter-config JSON] [--smoke]

Per dialect (OpenAI chat with tools, Anthropic tool_use / tool_result), N sessions run side by
side. Each session has two conversations of its own (its own prefix-cache entries): one sent
straight to vLLM with the cap the exact count leads to, one through Envoy + incontext.

The two paths are interleaved in rounds: all N sessions send turn t of one path at the same
moment (a barrier), the bench waits until every stream has its first token and vLLM is idle
again (any count the filter makes after a stream ended included), then all N send turn t of
the other path; which path goes first alternates turn by turn. Both paths thus see the same
load (N requests at once, each at the same point of its conversation), and the vLLM API
server's CPU time over a round (/proc/PID/stat, all its threads) is that path's alone. Before
each round the bench asks vLLM for the exact count of every request (not timed) and checks
that the filter reached the outcome that count leads to.
"""

import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import proxies  # noqa: E402
import run  # noqa: E402

PATHS = ("direct", "filter")


def percentile(xs, q):
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def one_round(args, dialect, api, name, port, bodies, turn):
    """Sends turn `turn` of every session at once on one path; its rows and the round's."""
    plans = [run.planned(args.vllm_port, dialect, b, name == "direct") for b in bodies]
    run.settle(args.vllm_pid, args.settle)
    admin = args.port_base + 10
    before = run.stats(admin)
    cpu0, tree0 = run.cpu_s(args.vllm_pid), run.tree_cpu_s(args.vllm_pid)
    barrier = threading.Barrier(len(plans))
    results = [None] * len(plans)

    def send(i):
        try:
            barrier.wait()
            results[i] = run.first_token(port, api, plans[i][0])
        except Exception as e:  # noqa: BLE001 - reported below, after every thread ended
            results[i] = e

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(plans))]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = (time.perf_counter() - t0) * 1000
    run.settle(args.vllm_pid, args.settle)
    cpu = run.cpu_s(args.vllm_pid) - cpu0
    engine = run.tree_cpu_s(args.vllm_pid) - tree0 - cpu
    after = run.stats(admin)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"{dialect} turn {turn} {name}: {failed[0]}")
    rows = []
    for s, ((_, p, _, want), (ttft, headers)) in enumerate(zip(plans, results)):
        row = {"kind": "request", "dialect": dialect, "session": args.seed + s, "turn": turn,
               "path": name, "P": p, "ttft": ttft}
        if name == "filter":
            row["ok"] = run.outcome_ok(headers, want)
            row["action"] = headers.get("x-incontext-action")
            row["source"] = headers.get("x-incontext-source")
        rows.append(row)
    calls = proxies.on_path_calls(before, after) if name == "filter" else 0
    summary = {"kind": "round", "dialect": dialect, "turn": turn, "path": name,
               "P": [min(r["P"] for r in rows), max(r["P"] for r in rows)], "wall_ms": wall,
               "cpu_api_ms": cpu * 1000, "cpu_engine_ms": engine * 1000, "count_calls": calls,
               "skipped": after.get("incontext_count_skipped", 0)
               - before.get("incontext_count_skipped", 0) if name == "filter" else 0}
    return rows, summary


def replay(args, dialect):
    convs = []
    for seed in range(args.seed, args.seed + args.sessions):
        api, c = run.conversations(dialect, PATHS, args.run_id, args.turns, seed)
        convs.append(c)
    ports = {"direct": args.vllm_port, "filter": args.port_base}
    requests, rounds = [], []
    for t in range(args.turns):
        order = PATHS if t % 2 == 0 else PATHS[::-1]
        for name in order:
            rows, rnd = one_round(args, dialect, api, name, ports[name],
                                  [c[name][t] for c in convs], t + 1)
            requests += rows
            rounds.append(rnd)
            print(json.dumps(rnd), flush=True)
    return requests, rounds


def summary(requests, rounds):
    out = {}
    for name in PATHS:
        reqs = [r for r in requests if r["path"] == name]
        rnds = [r for r in rounds if r["path"] == name]
        ttft = [r["ttft"] for r in reqs]
        long = [r["ttft"] for r in reqs if r["P"] >= 8000]
        out[name] = {
            "requests": len(reqs), "p50": percentile(ttft, 50), "p99": percentile(ttft, 99),
            "long": len(long), "p50_long": percentile(long, 50), "p99_long": percentile(long, 99),
            "cpu_api": sum(r["cpu_api_ms"] for r in rnds) / 1000,
            "cpu_engine": sum(r["cpu_engine_ms"] for r in rnds) / 1000,
            "wall_p50": percentile([r["wall_ms"] for r in rnds], 50),
            "count_calls": sum(r["count_calls"] for r in rnds),
            "skipped": sum(r["skipped"] for r in rnds),
            "ok": all(r.get("ok", True) for r in reqs),
        }
    return out


def markdown(args, extra, requests, rounds, sums):
    run_line = proxies.command_line("concurrent", args)
    out = ["# Many sessions at once: TTFT and vLLM API-server CPU, straight and through incontext",
           "", f"Generated by {run_line} ({args.env}). W = {run.W}, B = {run.B} (`max_tokens` of "
           f"every turn), R = {run.R}; {args.sessions} sessions per dialect at once, "
           f"{args.turns} turns each, streamed. Plugin configuration: envoy/envoy.yaml's with "
           f"`{json.dumps(extra, sort_keys=True)}`. Rounds: all sessions send a turn at the same "
           "moment on one path, then (vLLM idle again) on the other; the first path alternates "
           "turn by turn. CPU: vLLM's API-server process, all threads (/proc/PID/stat; 10 ms "
           "ticks), over each round until vLLM is idle, so counts the filter makes after a "
           "stream ended are its path's; engine: its child processes.", "",
           "| session | path | requests | TTFT p50 ms | TTFT p99 ms | p50 / p99, P ≥ 8000 "
           "(requests) | API-server CPU s | engine CPU s | count calls on the path | skipped "
           "| round wall p50 ms | outcome = exact-count outcome |",
           "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for dialect, s in sums.items():
        for name in PATHS:
            x = s[name]
            long = (f"{x['p50_long']:.0f} / {x['p99_long']:.0f} ({x['long']})" if x["long"]
                    else "none")
            out.append(
                f"| {run.DIALECTS[dialect]} | {'straight' if name == 'direct' else 'incontext'} | "
                f"{x['requests']} | {x['p50']:.0f} | {x['p99']:.0f} | {long} | "
                f"{x['cpu_api']:.2f} | {x['cpu_engine']:.2f} | {x['count_calls'] if name == 'filter' else '–'} | "
                f"{x['skipped'] if name == 'filter' else '–'} | {x['wall_p50']:.0f} | "
                f"{('every turn' if x['ok'] else 'NO') if name == 'filter' else '–'} |")
    out += ["", "Ratios through incontext / straight: " + "; ".join(
        f"{d}: TTFT p50 {s['filter']['p50'] / s['direct']['p50']:.3f}, "
        f"p99 {s['filter']['p99'] / s['direct']['p99']:.3f}, API-server CPU "
        f"{s['filter']['cpu_api'] / max(s['direct']['cpu_api'], 0.01):.3f}"
        for d, s in sums.items()) + ".", "", "## Every round", "",
        "| session | turn | path | P | wall ms | TTFT min / max ms | API-server CPU ms "
        "| count calls on the path |", "|---|--:|---|--:|--:|--:|--:|--:|"]
    for rnd in rounds:
        ttft = [r["ttft"] for r in requests if (r["dialect"], r["turn"], r["path"])
                == (rnd["dialect"], rnd["turn"], rnd["path"])]
        out.append(f"| {rnd['dialect']} | {rnd['turn']} | {rnd['path']} | "
                   f"{rnd['P'][0]}–{rnd['P'][1]} | {rnd['wall_ms']:.0f} | "
                   f"{min(ttft):.0f} / {max(ttft):.0f} | {rnd['cpu_api_ms']:.0f} | "
                   f"{rnd['count_calls'] if rnd['path'] == 'filter' else '–'} |")
    return "\n".join(out) + "\n"


def main():
    args = proxies.arguments(__doc__.splitlines()[0], 8, 30, (3, 4))
    extra = proxies.plugin_extra(run.W, args.filter_config)
    requests, rounds, sums = [], [], {}
    with proxies.started(args.envoy, args.work, args.wasm, args.vllm_port,
                         [(args.port_base, args.port_base + 10)], extra):
        for dialect in args.dialects.split(","):
            rq, rd = replay(args, dialect)
            requests += rq
            rounds += rd
            sums[dialect] = summary(rq, rd)
            print(json.dumps({dialect: sums[dialect]}), flush=True)
        counters = run.stats(args.port_base + 10)
    report = (markdown(args, extra, requests, rounds, sums)
              + "\nThe filter's counters at the end of the run: "
              + json.dumps(counters, sort_keys=True) + ".\n")
    return run.write_results(args, requests + rounds, report,
                             [d for d, s in sums.items() if not s["filter"]["ok"]],
                             counters.get("incontext_bound_violations", 0))

if __name__ == "__main__":
    sys.exit(main())
