"""docs/spec.md §6, §15: the count and anchor tables under many conversations at once. With a
table of one set (`cache_entries` 16), conversations interleaved turn by turn evict each
other's anchors: every grown turn is counted whole, `incontext_evictions` and
`incontext_evicted_recounts` move by exactly what the tables did, and the alert
`IncontextTableTooSmall` (deploy/prometheus/incontext-rules.yml), evaluated on the metrics
Envoy exports, fires. With the shipped size, the same traffic on more conversations skips the
count of every grown turn, evicts nothing, and the alert is silent."""

import re
from pathlib import Path

import yaml

from tests.e2e.common import cfg
from tests.e2e.test_dashboard import exported
from tests.e2e.test_skip import turns
from tests.harness import promql

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "incontext-rules.yml"
WAYS = 16    # entries of a set (docs/spec.md §6)
RECORD = 256  # evictions a set of the anchor table remembers


def alert_expr():
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (rule,) = [r for g in doc["groups"] for r in g["rules"]
               if r.get("alert") == "IncontextTableTooSmall"]
    return rule["expr"]


# The alert's shape: a ratio of two counters' increases per instance, over a threshold.
SHAPE = re.compile(
    r"^\s*sum by \(instance\) \(increase\((\w+)\[(\w+)\]\)\)\s*"
    r"/ sum by \(instance\) \(increase\((\w+)\[(\w+)\]\)\)\s*> ([0-9.]+)\s*$")


def fires(before: str, after: str) -> bool:
    """The alert's expression on one Envoy scraped before and after the traffic, the traffic
    within its range (the increase of a counter is then its difference)."""
    m = SHAPE.match(alert_expr())
    assert m, f"IncontextTableTooSmall changed shape; teach this evaluator: {alert_expr()}"
    num, _, den, _, threshold = m.groups()
    b, a = promql.parse_exposition(before), promql.parse_exposition(after)
    assert num in a.series and den in a.series, (num, den)
    increase = {n: a.total([n]) - b.total([n]) for n in (num, den)}
    assert increase[den] > 0
    return increase[num] / increase[den] > float(threshold)


def interleave(proxy, sessions: int, rounds: int):
    """`sessions` conversations of `rounds` turns, every session's turn t before any session's
    turn t+1, one request at a time; the sources of the grown turns' answers, and the metrics
    exported before and after."""
    bodies = [turns(rounds, 16000) for _ in range(sessions)]
    before = exported(proxy)
    sources = {}
    for t in range(rounds):
        for s in range(sessions):
            res = proxy.post(bodies[s][t], counters=False)
            assert res.status == 200, res.describe()
            if t > 0:
                sources[res.source] = sources.get(res.source, 0) + 1
    return sources, before


def moved(before: str, after: str, name: str) -> int:
    return int(promql.parse_exposition(after).total([name])
               - promql.parse_exposition(before).total([name]))


def test_a_table_too_small_evicts_counts_every_grown_turn_and_alerts(proxy_for, upstream):
    proxy = proxy_for(cfg(cache_entries=WAYS), fresh=True)
    upstream.tokenizer.count(1000)
    # 40 conversations: between two turns of one, 39 others store an anchor into the one
    # set; the 16th evicts it, and the 23 after it leave it within the set's record.
    sessions, rounds = 40, 3
    assert WAYS < sessions - 1 < WAYS + RECORD
    sources, before = interleave(proxy, sessions, rounds)
    after = exported(proxy)
    requests = sessions * rounds
    grown = sessions * (rounds - 1)
    assert sources == {"exact": grown}, sources
    assert moved(before, after, "incontext_count_skipped") == 0
    assert moved(before, after, "incontext_evicted_recounts") == grown
    # Every request stored one new count and one new anchor: each store past the 16 ways of
    # each table evicted one.
    assert moved(before, after, "incontext_evictions") == 2 * (requests - WAYS)
    assert moved(before, after, "incontext_count_calls") == requests
    assert fires(before, after)


def test_the_shipped_table_keeps_every_conversation_and_the_alert_is_silent(proxy_for, upstream):
    proxy = proxy_for(cfg(), fresh=True)
    upstream.tokenizer.count(1000)
    sessions, rounds = 300, 3
    sources, before = interleave(proxy, sessions, rounds)
    after = exported(proxy)
    grown = sessions * (rounds - 1)
    assert sources == {"bound": grown}, sources
    assert moved(before, after, "incontext_count_skipped") == grown
    assert moved(before, after, "incontext_evicted_recounts") == 0
    assert moved(before, after, "incontext_evictions") == 0
    assert not fires(before, after)
