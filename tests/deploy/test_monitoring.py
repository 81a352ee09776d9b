"""The monitoring under deploy/grafana and deploy/prometheus, checked without running them.

* Every PromQL expression of the dashboard and of every rule file goes through Prometheus' own
  parser and linter (tests/harness/promql.py: npm @prometheus-io/codemirror-promql, the one
  Prometheus' web UI runs; scripts/setup-deploy.sh installs it): syntax and types.
* The rule files have Prometheus' rule-file structure: groups with unique names, each rule an
  alert or a recording rule with an expression, durations where durations go, string labels and
  annotations, a severity, a summary and a description whose templates name only labels the
  expression keeps.
* The dashboard: unique panel ids, known panel types, panels inside the 24-column grid and not
  overlapping, every query on the dashboard's datasource variable, legends naming only labels
  the query keeps, subqueries at the scrape interval the shipped Prometheus uses (which is also
  the datasource's timeInterval).
* The Prometheus configuration and Grafana provisioning files have the keys they need.
* Broken copies are rejected by the same checks, so the checks are shown to look.

Whether the metric names exist in Envoy's output is tests/e2e/test_dashboard.py's part; how the
compose profile mounts these files is tests/compose's.

Run: .venv/bin/python -m pytest tests/deploy/test_monitoring.py
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.harness import promql
from tests.harness.promql import analyser  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "incontext.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "incontext.yml"
RULE_FILES = sorted(promql.PROMETHEUS_DIR.glob("incontext-rules*.yml"))

DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
TEMPLATE_BODY = re.compile(
    r"^\s*\$(value|labels\.([a-zA-Z_][a-zA-Z0-9_]*))"
    r"(\s*\|\s*(humanize|humanizePercentage|humanizeDuration))?\s*$")
SEVERITIES = {"critical", "warning"}
GROUP_KEYS = {"name", "interval", "rules", "limit", "query_offset", "labels"}
ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
RECORD_KEYS = {"record", "expr", "labels"}
PANEL_TYPES = {"stat", "timeseries"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def kept_labels(analysis: dict) -> set:
    """Labels an expression's result can carry that the checks here can name: its grouping
    labels, the labels its label_replace calls make, and Prometheus' target labels."""
    return set(analysis["grouping"]) | {r["dst"] for r in analysis["replacements"]} \
        | promql.TARGET_LABELS


# --- rule files --------------------------------------------------------------------------------
def rule_problems(doc, analyser) -> list:
    """Prometheus' rule-file structure (what `promtool check rules` checks, less its parser,
    which is the analyser's part)."""
    if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
        return ["the file must be a mapping with only `groups`, a list"]
    out = []
    names = [g.get("name") for g in doc["groups"] if isinstance(g, dict)]
    if len(names) != len(set(names)) or len(names) != len(doc["groups"]):
        out.append(f"group names must be unique: {names}")
    for g in doc["groups"]:
        if not isinstance(g, dict) or not isinstance(g.get("name"), str) or not g["name"]:
            out.append(f"a group without a name: {g!r:.80}")
            continue
        where = f"group {g['name']}"
        if set(g) - GROUP_KEYS:
            out.append(f"{where}: unknown keys {sorted(set(g) - GROUP_KEYS)}")
        if "interval" in g and not DURATION.match(str(g["interval"])):
            out.append(f"{where}: interval {g['interval']!r} is not a duration")
        if not isinstance(g.get("rules"), list) or not g["rules"]:
            out.append(f"{where}: no rules")
            continue
        for r in g["rules"]:
            out += [f"{where}: {p}" for p in one_rule_problems(r, analyser)]
    return out


def one_rule_problems(r, analyser) -> list:
    if not isinstance(r, dict) or ("alert" in r) == ("record" in r):
        return [f"a rule must be exactly one of alert or record: {r!r:.80}"]
    name = r.get("alert") or r.get("record")
    keys = ALERT_KEYS if "alert" in r else RECORD_KEYS
    out = []
    if set(r) - keys:
        out.append(f"{name}: unknown keys {sorted(set(r) - keys)}")
    if not isinstance(name, str) or not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", name):
        out.append(f"{name!r} is not a valid rule name")
    if not isinstance(r.get("expr"), str) or not r["expr"].strip():
        return out + [f"{name}: no expr"]
    analysis = analyser.analyse(r["expr"])
    out += [f"{name}: {d}" for d in analysis["diagnostics"]]
    for key in ("for", "keep_firing_for"):
        if key in r and not DURATION.match(str(r[key])):
            out.append(f"{name}: {key} {r[key]!r} is not a duration")
    for key in ("labels", "annotations"):
        v = r.get(key, {})
        if not isinstance(v, dict) or not all(
                isinstance(k, str) and LABEL_NAME.match(k) and isinstance(x, str)
                for k, x in v.items()):
            out.append(f"{name}: {key} must map label names to strings: {v!r:.120}")
    if "alert" in r:
        labels, annotations = r.get("labels") or {}, r.get("annotations") or {}
        if isinstance(labels, dict) and labels.get("severity") not in SEVERITIES:
            out.append(f"{name}: severity must be one of {sorted(SEVERITIES)}")
        if isinstance(annotations, dict):
            if not {"summary", "description"} <= set(annotations):
                out.append(f"{name}: needs a summary and a description")
            kept = kept_labels(analysis)
            for text in annotations.values():
                for body in TEMPLATE.findall(str(text)):
                    m = TEMPLATE_BODY.match(body)
                    if not m:
                        out.append(f"{name}: template {{{{{body}}}}} is not $value or $labels.X")
                    elif m.group(2) and m.group(2) not in kept:
                        out.append(f"{name}: $labels.{m.group(2)} is not kept by the expression")
                if str(text).count("{{") != str(text).count("}}"):
                    out.append(f"{name}: unbalanced template braces")
    return out


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_is_valid(path, analyser):
    assert rule_problems(yaml.safe_load(path.read_text(encoding="utf-8")), analyser) == []


def test_rule_files_are_the_expected_alerts():
    """The alerts docs/operations.md describes, each in one file."""
    alerts = {p.name: [r["alert"] for g in yaml.safe_load(p.read_text())["groups"]
                       for r in g["rules"]] for p in RULE_FILES}
    assert alerts == {
        "incontext-rules.yml": ["IncontextBoundViolation", "IncontextTokenizerFailing",
                                "IncontextEstimatesRising", "IncontextTableTooSmall"],
        "incontext-rules-usage.yml": ["IncontextUsageMismatch"],
    }
    doc = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in (a for names in alerts.values() for a in names):
        assert f"`{name}`" in doc, f"docs/operations.md does not describe {name}"


def _rule(doc):
    return doc["groups"][0]["rules"][0]


BROKEN_RULES = {
    "expr with a syntax error": lambda d: _rule(d).__setitem__("expr", "sum(rate(x[5m])"),
    "rate of an instant vector": lambda d: _rule(d).__setitem__("expr", "rate(incontext_requests) > 0"),
    "for not a duration": lambda d: _rule(d).__setitem__("for", "soon"),
    "alert and record": lambda d: _rule(d).__setitem__("record", "x"),
    "unknown rule key": lambda d: _rule(d).__setitem__("fire_after", "5m"),
    "label not a string": lambda d: _rule(d)["labels"].__setitem__("page", True),
    "no severity": lambda d: _rule(d)["labels"].pop("severity"),
    "no description": lambda d: _rule(d)["annotations"].pop("description"),
    "template with a label the expression drops": lambda d: _rule(d)["annotations"].__setitem__(
        "summary", "on {{ $labels.route }}"),
    "template not $value or $labels": lambda d: _rule(d)["annotations"].__setitem__(
        "summary", "{{ .Value }}"),
    "duplicate group name": lambda d: d["groups"].append(copy.deepcopy(d["groups"][0])),
    "group without rules": lambda d: d["groups"][0].__setitem__("rules", []),
    "unknown top-level key": lambda d: d.__setitem__("rules", []),
}


@pytest.mark.parametrize("breakage", list(BROKEN_RULES))
def test_broken_rule_file_is_rejected(breakage, analyser):
    doc = yaml.safe_load((promql.PROMETHEUS_DIR / "incontext-rules.yml").read_text())
    assert rule_problems(copy.deepcopy(doc), analyser) == []
    BROKEN_RULES[breakage](doc)
    assert rule_problems(doc, analyser) != []


# --- the dashboard -----------------------------------------------------------------------------
def scrape_interval() -> str:
    return yaml.safe_load(promql.PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]


def dashboard_problems(dash, analyser) -> list:
    out = []
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in dash:
            out.append(f"no {key}")
    if out:
        return out
    if dash.get("id") is not None:
        out.append("a provisioned dashboard has no id (Grafana assigns it)")
    variables = {v.get("name"): v for v in dash["templating"].get("list", [])}
    ds = variables.get("datasource", {})
    if ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        out.append("no `datasource` variable of Prometheus datasources")
    ps = promql.panels(dash)
    ids = [p.get("id") for p in ps]
    if len(set(ids)) != len(ids):
        out.append(f"panel ids not unique: {ids}")
    cells = {}
    for p in ps:
        where = f"panel {p.get('title')!r}"
        if p.get("type") not in PANEL_TYPES:
            out.append(f"{where}: type {p.get('type')!r} not in {sorted(PANEL_TYPES)}")
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) and g[k] >= 0 for k in "hwxy") or g["w"] < 1 \
                or g["h"] < 1 or g["x"] + g["w"] > 24:
            out.append(f"{where}: gridPos {g} outside the 24-column grid")
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    out.append(f"{where} overlaps {cells[(x, y)]!r}")
                    break
                cells[(x, y)] = p.get("title")
            else:
                continue
            break
        if p.get("datasource") != DATASOURCE:
            out.append(f"{where}: datasource {p.get('datasource')} is not {DATASOURCE}")
        targets = p.get("targets") or []
        if not targets:
            out.append(f"{where}: no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            out.append(f"{where}: refIds {refs} not unique")
        for t in targets:
            out += [f"{where} {t.get('refId')}: {x}" for x in target_problems(t, analyser)]
    return out


def target_problems(t, analyser) -> list:
    if t.get("datasource") != DATASOURCE:
        return [f"datasource {t.get('datasource')} is not {DATASOURCE}"]
    if not isinstance(t.get("expr"), str):
        return ["no expr"]
    expr = promql.grafana_promql(t["expr"])
    out = [f"Grafana variable {v} left in the query" for v in re.findall(r"\$\{?__\w+", expr)]
    analysis = analyser.analyse(expr)
    out += analysis["diagnostics"]
    out += [f"{u} is not analysed here" for u in analysis["unsupported"]]
    kept = kept_labels(analysis)
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
        if label not in kept:
            out.append(f"legend names {label!r}, which the query does not keep")
    for step in re.findall(r"\[[^\]:]+:([^\]]+)\]", expr):
        if step != scrape_interval():
            out.append(f"subquery resolution {step} is not the scrape interval {scrape_interval()}")
    return out


def load_dashboard() -> dict:
    return json.loads(promql.DASHBOARD.read_text(encoding="utf-8"))


def test_dashboard_is_valid(analyser):
    assert dashboard_problems(load_dashboard(), analyser) == []


def test_dashboard_covers_the_operator_metrics():
    """Every metric family docs/spec.md §9 lists is on the dashboard (the route panel reads
    incontext_route_<route>_*)."""
    exprs = " ".join(q.expr for q in promql.dashboard_queries())
    for name in ("incontext_requests", "incontext_rewritten", "incontext_rejected",
                 '"incontext_unchanged_.+"', "incontext_count_calls", "incontext_tail_counts",
                 "incontext_count_skipped", "incontext_count_ms_bucket", "incontext_estimates",
                 "incontext_tokenizer_calls", '"incontext_tokenizer_failures_.+"',
                 "incontext_bound_checks", "incontext_bound_violations", "incontext_translated",
                 "incontext_window_stop", "incontext_cache_hits", "incontext_cache_misses",
                 "incontext_orphans", "incontext_wasm_memory_bytes", '"incontext_route_.+_requests"',
                 "incontext_evictions", "incontext_evicted_recounts"):
        assert name in exprs, f"{name} is on no panel"


def _panel(d, title):
    return next(p for p in d["panels"] if p["title"] == title)


BROKEN_DASHBOARDS = {
    "query with a syntax error": lambda d: _panel(d, "Decisions by action")["targets"][0]
    .__setitem__("expr", "sum(rate(incontext_rewritten[$__rate_interval])"),
    "histogram_quantile of a counter rate without le": lambda d: _panel(d, "Count time")["targets"][0]
    .__setitem__("expr", "histogram_quantile(0.5, rate(incontext_count_ms_bucket))"),
    "unknown Grafana variable": lambda d: _panel(d, "Estimates")["targets"][0]
    .__setitem__("expr", "sum(rate(incontext_estimates[$window]))"),
    "legend with a label the query drops": lambda d: _panel(d, "Estimates")["targets"][0]
    .__setitem__("legendFormat", "{{reason}}"),
    "fixed datasource": lambda d: _panel(d, "Estimates").__setitem__(
        "datasource", {"type": "prometheus", "uid": "prom1"}),
    "overlapping panels": lambda d: _panel(d, "Estimates")["gridPos"].__setitem__("y", 4),
    "wider than the grid": lambda d: _panel(d, "Per route")["gridPos"].__setitem__("x", 2),
    "duplicate panel id": lambda d: _panel(d, "Estimates").__setitem__(
        "id", _panel(d, "Count time")["id"]),
    "unknown panel type": lambda d: _panel(d, "Estimates").__setitem__("type", "graph2"),
    "duplicate refId": lambda d: _panel(d, "Count time")["targets"][1].__setitem__("refId", "A"),
    "subquery off the scrape interval": lambda d: _panel(d, "Unchanged by reason")["targets"][0]
    .__setitem__("expr", _panel(d, "Unchanged by reason")["targets"][0]["expr"]
                 .replace(":15s]", ":1m]")),
    "no datasource variable": lambda d: d["templating"].__setitem__("list", []),
}


@pytest.mark.parametrize("breakage", list(BROKEN_DASHBOARDS))
def test_broken_dashboard_is_rejected(breakage, analyser):
    dash = load_dashboard()
    BROKEN_DASHBOARDS[breakage](dash)
    assert dashboard_problems(dash, analyser) != []


# --- Prometheus configuration and Grafana provisioning ------------------------------------------
def test_prometheus_config():
    doc = yaml.safe_load(promql.PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    assert set(doc) == {"global", "rule_files", "scrape_configs"}, doc
    for key in ("scrape_interval", "evaluation_interval"):
        assert DURATION.match(doc["global"][key]), doc["global"]
    loaded = promql.loaded_rule_files()
    assert loaded and all(p in [f.resolve() for f in RULE_FILES] for p in loaded), loaded
    (job,) = doc["scrape_configs"]
    assert job["metrics_path"] == "/stats/prometheus", job
    (static,) = job["static_configs"]
    assert len(static["targets"]) == 1, static
    assert re.fullmatch(r"[a-z0-9-]+:\d+", static["targets"][0]), static


def test_grafana_provisioning():
    ds = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy", source
    assert source["isDefault"] is True, source
    assert re.fullmatch(r"http://[a-z0-9-]+:\d+", source["url"]), source
    assert source["jsonData"]["timeInterval"] == scrape_interval(), (
        "the datasource's timeInterval is the scrape interval ($__rate_interval's floor)")
    prov = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/"), provider
