"""The shipped monitoring reads what Envoy exports: traffic of every kind through the real Envoy
with the filter (scripted upstream), then every metric and label that a query of the Grafana
dashboard (deploy/grafana/incontext.json) or of a rule file that the shipped Prometheus loads
(deploy/prometheus/prometheus.yml `rule_files`) reads must be in Envoy's /stats/prometheus
(histograms: their `_bucket` series with `le`), and every counter they read must have moved
under that traffic. A renamed metric, or a query that names one wrongly, fails here.

A rule file Prometheus does not load must read a metric Envoy does not export yet; once Envoy
exports all it reads, this fails until the file joins `rule_files`.

The queries are read with Prometheus' own parser (tests/harness/promql.py; scripts/setup-deploy.sh
installs it); tests/deploy/test_monitoring.py checks their syntax and the files' structure.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.e2e.common import C, W, assert_rewritten, assert_unchanged, cfg, chat
from tests.e2e.test_answers import (PROMPT_TOO_LONG, anthropic_json, messages_body, scripted,
                                    vllm_error)
from tests.e2e.test_skip import second_turn, tail_count, turns, wait_for_calls
from tests.harness import promql
from tests.harness.promql import analyser  # noqa: F401 (a fixture)
from tests.harness.upstream import Answer, ok



def exported(proxy) -> str:
    """Envoy's /stats/prometheus as the shipped Prometheus stores it: the wasm build's metrics
    come as `incontext_*`, the module's as `envoy_dynamicmodulescustom_incontext_*`, which
    its scrape configuration renames to the same names."""
    return promql.scraped(proxy.envoy.prometheus())


STRICT = "strict/model"
# skip_count for the bound's counters, tables of one set of 16 entries for the evictions, a
# route for the per-route counters (it rejects what does not fit, for incontext_rejected).
CONFIG = cfg(skip_count=True, cache_entries=16,
             routes=[{"model": STRICT, "name": "strict", "on_insufficient": "reject"}])


def wait_for(proxy, name: str, at_least: int, timeout=20.0, nudge=None):
    """Waits until /stats/prometheus shows ``name`` at ``at_least`` (Envoy publishes
    histograms at its stats flush, every 5 s); ``nudge`` runs before each look."""
    deadline = time.monotonic() + timeout
    while True:
        if nudge:
            nudge()
        value = promql.parse_exposition(exported(proxy)).total([name])
        if value >= at_least:
            return
        assert time.monotonic() < deadline, f"{name} stayed at {value}"
        time.sleep(0.2)


def drive(proxy, upstream):
    """One request or conversation for each thing the dashboard shows, each asserted."""
    upstream.tokenizer.count(100)
    first = proxy.post(chat(max_tokens=100000))
    assert_rewritten(first, 100)
    again = proxy.post(first.sent)                         # the same prompt: a cache hit
    assert again.delta.get("incontext_cache_hits") == 1, again.describe()
    assert_unchanged(proxy.post(b"not json"), "not_json")
    routed = proxy.post(chat(max_tokens=100000, model=STRICT))
    assert routed.action == "rewritten", routed.describe()
    assert routed.delta.get("incontext_route_strict_rewritten") == 1, routed.delta

    upstream.tokenizer.count(W)                            # no room left: the route rejects
    rejected = proxy.post(chat(max_tokens=100000, model=STRICT))
    assert rejected.status == 400 and rejected.action == "rejected", rejected.describe()
    assert rejected.delta.get("incontext_rejected") == 1, rejected.delta

    upstream.tokenizer.count(100)                          # the server's usage disagrees
    h = scripted(upstream, Answer(200, [b'{"choices":[],"usage":{"prompt_tokens":101}}']))
    disagreed = proxy.post(chat(max_tokens=100000), headers=h)
    assert disagreed.delta.get("incontext_usage_mismatch") == 1, disagreed.describe()

    upstream.tokenizer.status(500)                         # the count fails: the estimate
    estimated = proxy.post(chat(max_tokens=100000))
    assert estimated.source == "estimate", estimated.describe()
    assert estimated.delta.get("incontext_tokenizer_failures_status") == 1, estimated.delta
    assert estimated.delta.get("incontext_estimates") == 1, estimated.delta

    upstream.tokenizer.always(ok(C + 500))                 # the server's window error, translated
    h = scripted(upstream, Answer(400, [vllm_error(PROMPT_TOO_LONG)]))
    translated = proxy.post(chat(max_tokens=100000), headers=h)
    assert translated.delta.get("incontext_translated") == 1, translated.delta

    upstream.tokenizer.status(500)                         # an Anthropic answer stopped at the
    #                                                        cap written from the estimate
    h = scripted(upstream, Answer(200, [anthropic_json("max_tokens", "{max_tokens}")], length=True))
    stopped = proxy.post(messages_body(), path="/v1/messages", headers=h)
    assert stopped.delta.get("incontext_window_stop") == 1, stopped.delta

    # In tables of one set, 16 other conversations evict a conversation's anchor before its
    # second turn, which is counted whole.
    upstream.tokenizer.count(100)
    first, second = turns(2, 100000)
    assert_rewritten(proxy.post(first), 100)
    for _ in range(16):
        assert_rewritten(proxy.post(turns(1, 100000)[0]), 100)
    recounted = proxy.post(second)
    assert_rewritten(recounted, 100)
    assert recounted.delta.get("incontext_evicted_recounts") == 1, recounted.describe()
    assert recounted.delta.get("incontext_evictions") == 2, recounted.describe()

    # A conversation near the window's edge: its new messages counted alone (a tail).
    calls = len(upstream.tokenizer.snapshot())
    _, tail = second_turn(proxy, upstream, C - 1300, tail_count(1000, 50))
    assert_unchanged(tail, "fits")
    wait_for_calls(upstream, calls + 3)                    # the first turn's, the tail's, the check's
    assert proxy.envoy.counters().get("incontext_tail_counts") == 1

    # A turn skipped on a bound that its count, once answered, exceeds.
    calls = len(upstream.tokenizer.snapshot())
    _, skipped = second_turn(proxy, upstream, 100, lambda rec: ok(30000))
    assert_unchanged(skipped, "fits")
    wait_for_calls(upstream, calls + 2)
    # Moved by the check's answer, after its stream: the module moves it with the next one.
    wait_for(proxy, "incontext_bound_violations", 1,
             nudge=lambda: assert_unchanged(proxy.post(b"not json"), "not_json"))
    wait_for(proxy, "incontext_count_ms_count", 1)


def queries():
    """Every query the shipped monitoring runs: the dashboard's and those of the rule files
    prometheus.yml loads."""
    out = promql.dashboard_queries()
    for path in promql.loaded_rule_files():
        out += promql.rule_queries(path)
    return out


# The gauges of mechanisms the module does not have (docs/module.md): its dashboard panels
# stay empty.
NOT_IN_MODULE = ["incontext_orphans", "incontext_wasm_memory_bytes"]


def test_every_metric_the_monitoring_reads_is_exported_and_moves(proxy_for, upstream, analyser,
                                                                 glue):
    proxy = proxy_for(CONFIG, fresh=True)
    before = promql.parse_exposition(exported(proxy))
    drive(proxy, upstream)
    text = exported(proxy)
    after = promql.parse_exposition(text)
    qs = queries()
    assert len(qs) >= 20, [q.where for q in qs]
    problems = []
    still = []
    for q in qs:
        analysis = analyser.analyse(q.promql)
        problems += promql.problems(q, analysis, after)
        for sel in analysis["selectors"]:
            names = promql.selected(sel, after)
            counters = [n for n in names if after.types.get(n) == "counter"
                        or after.types.get(re.sub(r"_(bucket|count|sum)$", "", n)) == "histogram"]
            if counters and after.total(counters) <= before.total(counters):
                still.append(f"{q.where}: {promql.describe(sel)} did not move")
    if glue == "module":
        absent = [p for p in problems
                  if any(p.endswith(f"nothing exported matches {name}{{}}") for name in NOT_IN_MODULE)]
        assert len(absent) == len(NOT_IN_MODULE), problems
        problems = [p for p in problems if p not in absent]
    assert problems == [], "\n".join(problems)
    assert still == [], "\n".join(still)
    # The histogram is read through its buckets, each with its bound.
    buckets = after.series["incontext_count_ms_bucket"]
    assert [labels["le"] for labels, _ in buckets][-1] == "+Inf", buckets
    assert all(set(labels) == {"le"} for labels, _ in buckets), buckets


def test_the_route_panel_reads_named_and_numbered_routes(proxy_for, upstream, analyser):
    """Routes' counters are `incontext_route_<route>_*`: the per-route queries give each route
    its label, for a route's name as Envoy exports it and for a number in its place."""
    proxy = proxy_for(CONFIG)
    text = exported(proxy)
    numbered = re.sub(r"^incontext_route_strict_", "incontext_route_0_", text, flags=re.M)
    assert numbered != text
    route_queries = [q for q in promql.dashboard_queries() if "incontext_route_" in q.expr]
    assert len(route_queries) == 2, [q.where for q in route_queries]
    for exposition, route in ((text, "strict"), (numbered, "0")):
        e = promql.parse_exposition(exposition)
        for q in route_queries:
            analysis = analyser.analyse(q.promql)
            assert promql.problems(q, analysis, e) == [], q.where
            (r,) = analysis["replacements"]
            (sel,) = analysis["selectors"]
            (name,) = promql.selected(sel, e)
            assert promql.expand(r["replacement"], re.fullmatch(r["regex"], name)) == route, \
                (q.where, name)


def test_rule_files_not_loaded_wait_for_their_metrics(proxy_for, analyser):
    proxy = proxy_for(CONFIG)
    exposition = promql.parse_exposition(exported(proxy))
    loaded = promql.loaded_rule_files()
    for path in sorted(promql.PROMETHEUS_DIR.glob("*.yml")):
        if path.name == promql.PROMETHEUS_CONFIG.name or path.resolve() in loaded:
            continue
        missing = []
        for q in promql.rule_queries(path):
            missing += [m for m in promql.problems(q, analyser.analyse(q.promql), exposition)
                        if "nothing exported matches" in m]
        assert missing, (f"Envoy exports everything {path.name} reads: add it to rule_files in "
                         f"{promql.PROMETHEUS_CONFIG.name}")
