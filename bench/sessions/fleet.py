#!/usr/bin/env python3
"""One session's turns over several incontext replicas, with and without affinity.

    run.sh fleet [--sessions 2] [--turns 30] [--replicas 3] [--spread random|round-robin]
                 [--filter-config JSON] [--smoke]

Three (--replicas) Envoy + incontext processes in front of one vLLM, each with its own shared
data: the count cache and the anchors `skip_count` proves later turns from live in the Envoy
that served a turn. Each session has three conversations of its own (its own prefix-cache
entries), interleaved turn by turn in a rotating order as the four-way replay's are:

  direct    straight to vLLM, with the cap the exact count leads to (the reference)
  spread    each turn through a replica picked per turn (seeded random, or round-robin)
  affinity  every turn through the same replica (session i: replica i mod N)
  front     every turn through a front Envoy rendered from the shipped envoy/envoy-front.yaml
            (Maglev on the agent's session header) before the replicas: the conversation's
            own session header (`x-claude-code-session-id` on Anthropic turns, Codex's
            `session-id` on OpenAI ones) picks its replica, as in the compose `fleet` profile

For each filtered turn the bench records the replica, how long ago that replica last served
this conversation (`warm`: the previous turn; `stale`: an earlier one; `new`: never), the time
to first token, and what the replica's counters say the turn cost on its path (from its
/stats: `incontext_count_calls` whole prompts + `incontext_tail_counts` tails; read after
vLLM is idle again, so a count made after the stream is the separate `incontext_bound_checks`).
"""

import contextlib
import copy
import json
import os
import random
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import proxies  # noqa: E402
import run  # noqa: E402

PATHS = ("direct", "spread", "affinity", "front")
FILTERED = PATHS[1:]
KINDS = ("warm", "stale", "new")
# The header each dialect's agent names its session with (envoy/envoy-front.yaml's hash policy).
SESSION_HEADER = {"openai": "session-id", "anthropic": "x-claude-code-session-id"}


def front_config(port, admin, replicas):
    """envoy/envoy-front.yaml as shipped, on loopback: its listener on `port`, its admin on
    `admin`, and its `incontext` cluster the replicas' listeners (STATIC in place of the
    name Compose resolves to every replica). The routes and the hash policy stay as shipped."""
    with open(os.path.join(proxies.ROOT, "envoy", "envoy-front.yaml"), encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    cfg["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin}
    (listener,) = cfg["static_resources"]["listeners"]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    (cluster,) = cfg["static_resources"]["clusters"]
    cluster["type"] = "STATIC"
    cluster.pop("dns_lookup_family", None)
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1",
                                                      "port_value": p}}}}
        for p in replicas]
    return cfg


@contextlib.contextmanager
def front_started(envoy, work, port, admin, replicas):
    path = os.path.join(work, "front.yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(copy.deepcopy(front_config(port, admin, replicas)), f, sort_keys=False)
    proc = subprocess.Popen([envoy, "-c", path, "--concurrency", "2", "--disable-hot-restart",
                             "-l", "warn", "--log-path", os.path.join(work, "front.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not proxies.ready(admin):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the front Envoy is not ready (see {work}/front.log)")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proxies.reap(proc)


def kind(gap):
    return "new" if gap is None else "warm" if gap == 1 else "stale"


def replay(args, dialect, index, seed):
    api, convs = run.conversations(dialect, PATHS, args.run_id, args.turns, seed)
    n = args.replicas
    rng = random.Random(f"{args.seed}-{dialect}-{seed}")
    spread = ([rng.randrange(n) for _ in range(args.turns)] if args.spread == "random"
              else [(index + t) % n for t in range(args.turns)])
    pick = {"spread": spread, "affinity": [index % n] * args.turns}
    last = {name: {} for name in FILTERED}
    session = {SESSION_HEADER[dialect]: f"fleet-{args.run_id}-{dialect}-{seed}"}
    rows = []
    for t in range(args.turns):
        row = {"dialect": dialect, "session": seed, "turn": t + 1}
        k = t % len(PATHS)
        for name in PATHS[k:] + PATHS[:k]:
            sent, p, _, want = run.planned(args.vllm_port, dialect, convs[name][t],
                                           name == "direct")
            run.settle(args.vllm_pid, args.settle)
            if name == "direct":
                row["P"] = p
                row["ttft_direct"] = run.first_token(args.vllm_port, api, sent)[0]
                run.settle(args.vllm_pid, args.settle)
                continue
            if name == "front":
                # The front picks the replica: the one whose requests counter moved.
                admins = [args.port_base + 10 + i for i in range(n)]
                befores = [run.stats(a) for a in admins]
                ttft, headers = run.first_token(args.port_base + 5, api, sent, session)
                run.settle(args.vllm_pid, args.settle)
                afters = [run.stats(a) for a in admins]
                moved = [i for i in range(n) if afters[i].get("incontext_requests", 0)
                         != befores[i].get("incontext_requests", 0)]
                if len(moved) != 1:
                    raise RuntimeError(f"the front sent one turn to replicas {moved}")
                r = moved[0]
                before, after = befores[r], afters[r]
            else:
                r = pick[name][t]
                admin = args.port_base + 10 + r
                before = run.stats(admin)
                ttft, headers = run.first_token(args.port_base + r, api, sent)
                run.settle(args.vllm_pid, args.settle)
                after = run.stats(admin)
            seen = last[name].get(r)
            last[name][r] = t
            row.update({
                f"replica_{name}": r, f"ttft_{name}": ttft,
                f"gap_{name}": None if seen is None else t - seen,
                f"calls_{name}": proxies.on_path_calls(before, after),
                f"tails_{name}": after.get("incontext_tail_counts", 0)
                - before.get("incontext_tail_counts", 0),
                f"skipped_{name}": after.get("incontext_count_skipped", 0)
                - before.get("incontext_count_skipped", 0),
                f"source_{name}": headers.get("x-incontext-source"),
                f"action_{name}": headers.get("x-incontext-action"),
                f"ok_{name}": run.outcome_ok(headers, want)})
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def cost(rows, name):
    """Per kind of turn (turns 2 on: turn 1 is new on every path): turns, median TTFT ratio to
    direct (all, and P >= 8000), count calls on the path per turn, turns with none."""
    out = {}
    for k in KINDS:
        rs = [r for r in rows if r["turn"] > 1 and kind(r[f"gap_{name}"]) == k]
        long = [r for r in rs if r["P"] >= 8000]
        out[k] = {
            "turns": len(rs),
            "ratio": run.median([r[f"ttft_{name}"] / r["ttft_direct"] for r in rs]),
            "ratio_long": run.median([r[f"ttft_{name}"] / r["ttft_direct"] for r in long]),
            "long": len(long),
            "calls": sum(r[f"calls_{name}"] for r in rs) / len(rs) if rs else float("nan"),
            "tails": sum(r[f"tails_{name}"] for r in rs),
            "skipped": sum(r[f"skipped_{name}"] for r in rs),
            "none": sum(1 for r in rs if r[f"calls_{name}"] == 0),
        }
    return out


def summary(rows):
    return {name: {"kinds": cost(rows, name),
                   "calls": sum(r[f"calls_{name}"] for r in rows),
                   "ratio": run.median([r[f"ttft_{name}"] / r["ttft_direct"] for r in rows]),
                   "ok": all(r[f"ok_{name}"] for r in rows)}
            for name in FILTERED}


def share(s, name):
    """The share of turns 2 on that made no count call on their path."""
    kinds = s[name]["kinds"].values()
    turns = sum(x["turns"] for x in kinds)
    return sum(x["none"] for x in kinds) / turns if turns else float("nan")


def shares(s):
    """(front's share, one replica's share, front / one replica)."""
    front, one = share(s, "front"), share(s, "affinity")
    return front, one, front / one if one else float("nan")


def markdown(args, extra, rows, sums):
    run_line = proxies.command_line("fleet", args, f"--replicas {args.replicas}",
                                    f"--spread {args.spread}")
    out = ["# One session over several incontext replicas: with and without affinity", "",
           f"Generated by {run_line} ({args.env}). W = {run.W}, B = {run.B}, R = {run.R}; "
           f"{args.replicas} Envoy + incontext processes, each its own shared data, in front of "
           f"one vLLM; plugin configuration: envoy/envoy.yaml's with "
           f"`{json.dumps(extra, sort_keys=True)}`. Each session: four conversations of its "
           "own, interleaved turn by turn: `direct` (straight to vLLM), `spread` (each turn to a "
           f"replica picked {'at random, seeded' if args.spread == 'random' else 'round-robin'}), "
           "`affinity` (every turn to one replica), `front` (every turn through a front Envoy "
           "rendered from the shipped envoy/envoy-front.yaml, Maglev on the conversation's own "
           "session header: `session-id` on OpenAI turns, `x-claude-code-session-id` on "
           "Anthropic ones). A turn lands on a replica that served this "
           "conversation's previous turn (`warm`), an earlier turn only (`stale`), or none "
           "(`new`). Count calls on the path: the replica's `incontext_count_calls` + "
           "`incontext_tail_counts` over the turn. Turns 2 on (turn 1 is new everywhere). "
           f"Sessions per dialect: {args.sessions}.", "",
           "| session | path | turn lands | turns | median TTFT ratio to direct (P ≥ 8000: "
           "turns) | count calls on the path per turn | turns without one | tails counted "
           "| skipped (`incontext_count_skipped`) |", "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for dialect, s in sums.items():
        for name in FILTERED:
            for k, x in s[name]["kinds"].items():
                if not x["turns"]:
                    continue
                long = f"{x['ratio_long']:.3f}: {x['long']}" if x["long"] else "none"
                out.append(f"| {run.DIALECTS[dialect]} | {name} | {k} | {x['turns']} | "
                           f"{x['ratio']:.3f} ({long}) | {x['calls']:.2f} | {x['none']} | "
                           f"{x['tails']} | {x['skipped']} |")
    out += ["", "All turns: count calls on the path spread / affinity / front, median TTFT "
            "ratio to direct spread / affinity / front, outcome = exact-count outcome: "
            + "; ".join(
                f"{d}: " + " / ".join(str(s[n]['calls']) for n in FILTERED) + ", "
                + " / ".join(f"{s[n]['ratio']:.3f}" for n in FILTERED) + ", "
                + ('every turn' if all(s[n]['ok'] for n in FILTERED) else 'NO')
                for d, s in sums.items()) + ".", "",
            "Turns 2 on without a count call on their path, front against one replica "
            "(affinity): " + "; ".join(
                f"{d}: {shares(s)[0]:.3f} / {shares(s)[1]:.3f} = {shares(s)[2]:.2f}"
                for d, s in sums.items()) + ".", "", "## Every turn", "",
            "| session | turn | P | TTFT direct ms | spread: replica, lands, ms, calls, source "
            "| affinity: replica, lands, ms, calls, source | front: replica, lands, ms, calls, "
            "source |", "|---|--:|--:|--:|---|---|---|"]
    for r in rows:
        cells = [f"{r[f'replica_{n}']}, {kind(r[f'gap_{n}'])}"
                 f"{'' if r[f'gap_{n}'] in (None, 1) else ' (' + str(r[f'gap_{n}']) + ')'}, "
                 f"{r[f'ttft_{n}']:.0f}, {r[f'calls_{n}']}, {r[f'source_{n}']}"
                 for n in FILTERED]
        out.append(f"| {r['dialect']} {r['session']} | {r['turn']} | {r['P']} | "
                   f"{r['ttft_direct']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main():
    args = proxies.arguments(__doc__.splitlines()[0], 2, 30, (1, 8), (
        ("--replicas", {"type": int, "default": 3}),
        ("--spread", {"choices": ("random", "round-robin"), "default": "random"})))
    extra = proxies.plugin_extra(run.W, args.filter_config)
    listeners = [(args.port_base + i, args.port_base + 10 + i) for i in range(args.replicas)]
    rows, sums = [], {}
    with proxies.started(args.envoy, args.work, args.wasm, args.vllm_port, listeners, extra), \
            front_started(args.envoy, args.work, args.port_base + 5, args.port_base + 15,
                          [port for port, _ in listeners]):
        for dialect in args.dialects.split(","):
            rs = []
            for i, seed in enumerate(range(args.seed, args.seed + args.sessions)):
                rs += replay(args, dialect, i, seed)
            rows += rs
            sums[dialect] = summary(rs)
            print(json.dumps({dialect: sums[dialect]}), flush=True)
        counters = [run.stats(admin) for _, admin in listeners]
    report = (markdown(args, extra, rows, sums) + "\nThe replicas' counters at the end of the "
              "run: " + "; ".join(f"{i}: {json.dumps(c, sort_keys=True)}"
                                  for i, c in enumerate(counters)) + ".\n")
    return run.write_results(
        args, rows, report,
        [d for d, s in sums.items() if not all(s[n]["ok"] for n in FILTERED)],
        sum(c.get("incontext_bound_violations", 0) for c in counters))

if __name__ == "__main__":
    sys.exit(main())
