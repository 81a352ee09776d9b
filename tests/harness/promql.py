"""The PromQL of the shipped monitoring (deploy/grafana, deploy/prometheus), read with
Prometheus' own parser, and checked against what an Envoy exports on /stats/prometheus.

* ``Analyser`` runs tests/deploy/promql/analyse.mjs: Prometheus' PromQL grammar and linter
  (npm @prometheus-io/codemirror-promql, installed by scripts/setup-deploy.sh) give each
  expression's syntax and type errors, its selectors, grouping labels and label_replace /
  label_join calls.
* ``dashboard_queries``, ``rule_queries``: every expression of the dashboard (Grafana's interval
  variables replaced by durations, as Grafana does before it queries) and of a rule file.
* ``parse_exposition`` reads Prometheus' text format; ``problems`` lists what an analysed
  expression reads that the exposition lacks: a metric no series has, a label no selected
  series carries (nor Prometheus' target labels, nor a label_replace made), names a regex
  selects that collide once a range function drops ``__name__``, a label_replace that leaves
  a selected series without its label.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ANALYSER = ROOT / "tests" / "deploy" / "promql" / "analyse.mjs"
NODE_MODULES = ROOT / ".tools" / "deploy-promql" / "node_modules"
DASHBOARD = ROOT / "deploy" / "grafana" / "incontext.json"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"

# Grafana's built-in interval variables, as durations (what Grafana puts in before querying).
GRAFANA_INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
# Labels Prometheus attaches to every scraped series (not in Envoy's output).
TARGET_LABELS = frozenset({"job", "instance"})


class AnalyserMissing(Exception):
    pass


class Analyser:
    """One node process running analyse.mjs: an expression in, its analysis out."""

    def __init__(self):
        node = shutil.which("node")
        if node is None:
            raise AnalyserMissing("node not found (apt-get install nodejs)")
        if not NODE_MODULES.is_dir():
            raise AnalyserMissing(f"no PromQL parser in {NODE_MODULES}: run scripts/setup-deploy.sh")
        self.proc = subprocess.Popen([node, str(ANALYSER), str(NODE_MODULES)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def analyse(self, expr: str) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(expr) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"analyse.mjs exited ({self.proc.poll()})")
        return json.loads(line)

    def close(self):
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def analyser():
    """The fixture tests import: an Analyser for the module, or a failure saying what to
    install."""
    try:
        a = Analyser()
    except AnalyserMissing as e:
        pytest.fail(str(e), pytrace=False)
    yield a
    a.close()


@dataclass
class Query:
    where: str      # e.g. "dashboard panel 'Decisions' A", "incontext-rules.yml IncontextX"
    expr: str       # as written
    promql: str     # Grafana's variables replaced


def grafana_promql(expr: str) -> str:
    """``expr`` with Grafana's interval variables ($__rate_interval, ${__interval}, ...)
    replaced; any other variable is left, for the parser to refuse."""
    def sub(m):
        return GRAFANA_INTERVALS.get(m.group(1) or m.group(2), m.group(0))
    return re.sub(r"\$\{(__\w+)\}|\$(__\w+)", sub, expr)


def panels(dashboard: dict) -> List[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_queries(path: Path = DASHBOARD) -> List[Query]:
    dash = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for p in panels(dash):
        for t in p.get("targets", []):
            out.append(Query(f"dashboard panel {p.get('title')!r} {t.get('refId')}", t["expr"],
                             grafana_promql(t["expr"])))
    return out


def rule_queries(path: Path) -> List[Query]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for g in doc["groups"]:
        for r in g["rules"]:
            name = r.get("alert") or r.get("record")
            out.append(Query(f"{path.name} {g['name']}/{name}", r["expr"], r["expr"]))
    return out


def loaded_rule_files(config: Path = PROMETHEUS_CONFIG) -> List[Path]:
    """The rule files the shipped Prometheus configuration loads (relative to its directory)."""
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    return [(config.parent / f).resolve() for f in doc.get("rule_files") or []]


@functools.lru_cache(maxsize=None)
def name_relabellings(config: Path = PROMETHEUS_CONFIG) -> List[Tuple[re.Pattern, str]]:
    """The shipped scrape configuration's metric renames: each `metric_relabel_configs` rule
    that rewrites `__name__` from `__name__`, as (fully anchored regex, replacement in
    Python's syntax). Any other kind of rule is refused: this reads only renames."""
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    out = []
    for job in doc.get("scrape_configs") or []:
        for rule in job.get("metric_relabel_configs") or []:
            if (rule.get("source_labels") != ["__name__"] or rule.get("target_label") != "__name__"
                    or rule.get("action", "replace") != "replace"):
                raise ValueError(f"not a metric rename: {rule}")
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            out.append((re.compile(f"^(?:{rule['regex']})$"), replacement))
    return out


def scraped(text: str, config: Path = PROMETHEUS_CONFIG) -> str:
    """A /stats/prometheus answer with the metric names the shipped Prometheus stores (its
    renames applied to every sample and to the # TYPE and # HELP lines)."""
    rules = name_relabellings(config)

    def rename(name: str) -> str:
        for regex, replacement in rules:
            m = regex.match(name)
            if m:
                name = m.expand(replacement)
        return name

    out = []
    for line in text.splitlines():
        m = re.match(r"^(# (?:TYPE|HELP) )?([a-zA-Z_:][a-zA-Z0-9_:]*)(.*)$", line, re.S)
        out.append(f"{m.group(1) or ''}{rename(m.group(2))}{m.group(3)}" if m else line)
    return "\n".join(out) + "\n"


# --- Prometheus' text format ------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)$")

Series = Tuple[Dict[str, str], float]      # labels, value


@dataclass
class Exposition:
    series: Dict[str, List[Series]]          # metric name -> its series
    types: Dict[str, str]                    # from the # TYPE lines: counter, gauge, histogram

    def names(self) -> Set[str]:
        return set(self.series)

    def total(self, names) -> float:
        return sum(v for n in names for _, v in self.series.get(n, []))


def parse_exposition(text: str) -> Exposition:
    """A /stats/prometheus answer, read."""
    series: Dict[str, List[Series]] = {}
    types: Dict[str, str] = {}
    for line in text.splitlines():
        t = _TYPE.match(line)
        if t:
            types[t.group(1)] = t.group(2)
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a sample line: {line[:200]!r}")
        labels = {k: v for k, v in _LABEL.findall(m.group(2) or "")}
        series.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return Exposition(series, types)


def _matches(op: str, want: str, have: str) -> bool:
    if op == "=":
        return have == want
    if op == "!=":
        return have != want
    found = re.fullmatch(want, have) is not None
    return found if op == "=~" else not found


def selected(sel: dict, exposition: Exposition) -> Dict[str, List[Series]]:
    """The series a selector picks: {name: [series]}. A matcher on a target label is taken
    as met (Prometheus, not Envoy, sets it)."""
    name_matchers = [(m["op"], m["value"]) for m in sel["matchers"] if m["label"] == "__name__"]
    if sel["name"] is not None:
        name_matchers.append(("=", sel["name"]))
    others = [m for m in sel["matchers"] if m["label"] != "__name__"
              and m["label"] not in TARGET_LABELS]
    out = {}
    for name, series in exposition.series.items():
        if not all(_matches(op, v, name) for op, v in name_matchers):
            continue
        picked = [s for s in series
                  if all(_matches(m["op"], m["value"], s[0].get(m["label"], "")) for m in others)]
        if picked:
            out[name] = picked
    return out


def expand(replacement: str, m: re.Match) -> str:
    """label_replace's replacement ($1, ${1}, $name) for a match."""
    def group(g):
        key = g.group(1) or g.group(2)
        try:
            return m.group(int(key) if key.isdigit() else key) or ""
        except IndexError:
            return ""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", group, replacement)


def problems(q: Query, analysis: dict, exposition: Exposition) -> List[str]:
    """What ``q`` reads that ``exposition`` does not have (empty: it all exists)."""
    out = [f"{q.where}: {d}" for d in analysis["diagnostics"]]
    out += [f"{q.where}: {u} is not analysed here" for u in analysis["unsupported"]]
    picked = [selected(s, exposition) for s in analysis["selectors"]]
    labels: Set[str] = set(TARGET_LABELS)
    for sel, series in zip(analysis["selectors"], picked):
        if not series:
            out.append(f"{q.where}: nothing exported matches {describe(sel)}")
            continue
        have = {k for ss in series.values() for labels, _ in ss for k in labels}
        labels |= have
        for m in sel["matchers"]:
            if m["label"] != "__name__" and m["label"] not in TARGET_LABELS | have:
                out.append(f"{q.where}: no series of {describe(sel)} has the label {m['label']!r}")
    relabelled: Set[int] = set()
    for r in analysis["replacements"]:
        labels.add(r["dst"])
        relabelled |= set(r["selectors"])
        for src in r["src"]:
            if src != "__name__" and src not in labels:
                out.append(f"{q.where}: {r['function']} reads the label {src!r}, which nothing has")
        if r["function"] == "label_replace" and r["src"] == ["__name__"]:
            for i in r["selectors"]:
                values = {}
                for name in picked[i]:
                    m = re.fullmatch(r["regex"], name)
                    values[name] = expand(r["replacement"], m) if m else ""
                empty = sorted(n for n, v in values.items() if not v)
                if empty:
                    out.append(f"{q.where}: label_replace gives {r['dst']!r} no value for {empty}")
                if len(set(values.values())) != len(values):
                    out.append(f"{q.where}: label_replace gives {r['dst']!r} one value to several "
                               f"names: {values}")
    for i, (sel, series) in enumerate(zip(analysis["selectors"], picked)):
        if len(series) > 1 and i not in relabelled:
            out.append(f"{q.where}: {describe(sel)} selects {len(series)} names, which collide "
                       "once a function drops __name__: tell them apart with label_replace")
    for g in analysis["grouping"]:
        if g not in labels:
            out.append(f"{q.where}: groups by {g!r}, a label no selected series carries")
    return out


def describe(sel: dict) -> str:
    ms = ", ".join(f'{m["label"]}{m["op"]}{json.dumps(m["value"])}' for m in sel["matchers"])
    return f"{sel['name'] or ''}{{{ms}}}"
