"""Envoy + incontext instances for the concurrent and fleet modes of the session bench.

Each instance is envoy/envoy.yaml as the four-way replay renders it (bench/render.py's `proxy`:
loopback addresses, the `vllm` cluster pointed at the bench's vLLM, the wasm path, and the
plugin configuration: `context_length` plus the JSON object given with `--filter-config`), run
as its own Envoy process, so each holds its own shared data (counts, anchors).
"""

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("bench_render", os.path.join(ROOT, "bench", "render.py"))
bench_render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_render)

# Counters that tell what a request cost on its path (docs/spec.md §9, §15).
ON_PATH = ("incontext_count_calls", "incontext_tail_counts")


def shipped():
    with open(os.path.join(ROOT, "envoy", "envoy.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def plugin_extra(context, override):
    """The plugin configuration's changes: `context_length`, then the `--filter-config` object."""
    extra = {"context_length": context}
    if override:
        given = json.loads(override)
        if not isinstance(given, dict):
            raise SystemExit("--filter-config must be a JSON object")
        extra.update(given)
    return extra


def ready(admin):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=2)
        conn.request("GET", "/ready")
        text = conn.getresponse().read().decode(errors="replace")
        conn.close()
    except OSError:
        return False
    return "LIVE" in text


def on_path_calls(before, after):
    """Count calls a request made on its path: whole prompts and tails alone."""
    return sum(after.get(k, 0) - before.get(k, 0) for k in ON_PATH)


@contextlib.contextmanager
def started(envoy, work, wasm, vllm_port, listeners, extra):
    """Starts one Envoy + incontext per (port, admin port) in `listeners`; yields when all are
    ready, stops them on exit. Logs and configs stay in `work`."""
    cfg_shipped = shipped()
    procs = []
    # A SIGTERM ends the run like Ctrl-C does: through the `finally` that stops the Envoys.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for i, (port, admin) in enumerate(listeners):
            cfg = bench_render.proxy(cfg_shipped, wasm, port, admin, vllm_port, extra, True)
            path = os.path.join(work, f"filter-{i}.yaml")
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump(cfg, f, sort_keys=False)
            out = open(os.path.join(work, f"filter-{i}.out"), "wb")
            procs.append(subprocess.Popen(
                [envoy, "-c", path, "--concurrency", "2", "--disable-hot-restart", "-l", "warn",
                 "--log-path", os.path.join(work, f"filter-{i}.log")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
            out.close()
        deadline = time.monotonic() + 60
        for i, (_, admin) in enumerate(listeners):
            while not ready(admin):
                if procs[i].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Envoy {i} not ready (see {work}/filter-{i}.log)")
                time.sleep(0.1)
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            reap(p)


def reap(proc):
    """Waits for a terminated process, killing it after 15 s."""
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def command_line(mode, args, *more):
    """The run.sh command line that reproduces this run (markdown code)."""
    flags = ["--smoke"] if args.smoke else []
    flags += [f"--sessions {args.sessions}", f"--turns {args.turns}", *more]
    if args.dialects != "openai,anthropic":
        flags.append(f"--dialects {args.dialects}")
    if args.filter_config:
        flags.append(f"--filter-config '{args.filter_config}'")
    return f"`bench/sessions/run.sh {mode} " + " ".join(flags) + "`"


def arguments(description, sessions, turns, smoke, more=()):
    """The command line both modes share, plus `more` ((flag, argparse keywords), ...);
    `smoke`: (sessions, turns) of --smoke."""
    ap = argparse.ArgumentParser(description=description)
    for flag, kw in more:
        ap.add_argument(flag, **kw)
    ap.add_argument("--vllm-port", type=int, required=True)
    ap.add_argument("--vllm-pid", type=int, required=True, help="vLLM's API server process")
    ap.add_argument("--envoy", required=True, help="the Envoy binary")
    ap.add_argument("--wasm", required=True)
    ap.add_argument("--work", required=True, help="directory for the Envoy configs and logs")
    ap.add_argument("--port-base", type=int, default=18480)
    ap.add_argument("--sessions", type=int, help=f"sessions per dialect (default {sessions})")
    ap.add_argument("--turns", type=int, help=f"turns per session (default {turns})")
    ap.add_argument("--smoke", action="store_true",
                    help=f"a short run: {smoke[0]} sessions of {smoke[1]} turns per dialect")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dialects", default="openai,anthropic")
    ap.add_argument("--filter-config", default="",
                    help="JSON object merged into the plugin configuration (after context_length)")
    ap.add_argument("--settle", type=float, default=0.3)
    ap.add_argument("--run-id", default=str(int(time.time())))
    ap.add_argument("--env", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jsonl", required=True)
    args = ap.parse_args()
    defaults = smoke if args.smoke else (sessions, turns)
    args.sessions = args.sessions or defaults[0]
    args.turns = args.turns or defaults[1]
    return args
