"""deploy/grafana/enginefarm.json: a Grafana dashboard whose PromQL parses and names only metrics the farm exposes,
collected from the prometheus-client objects and the catalog collector the farm defines."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import pytest
from prometheus_client.metrics import MetricWrapperBase

from api import metrics as api_metrics
from api.metrics import CatalogCollector
from enginefarm.core.config import Settings
from server.embedded import prepare
from storage import metrics as storage_metrics
from worker.process import metrics as worker_metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "enginefarm.json"
SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
}
# Grafana's own variables, replaced by what Grafana would put there before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "6h"}
# Labels Prometheus adds to every series it scrapes (the target's, and Kubernetes service discovery's usual ones).
TARGET_LABELS = {"job", "instance", "namespace", "pod"}


@dataclass(frozen=True)
class Sample:
    family: str
    labels: frozenset[str]


def defined_metrics(tmp_path: Path) -> dict[str, Sample]:
    """Every sample name the farm exposes, with its family and labels: the prometheus-client metrics of the API,
    storage and worker modules, and the families the catalog collector yields at a scrape (a real, empty
    catalog)."""
    families = []
    for module in (api_metrics, storage_metrics, worker_metrics):
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase):
                families += [(f.name, f.type, obj._labelnames) for f in obj.describe()]
    settings = Settings(_env_file=None, data_dir=tmp_path, database_url=None)
    prepare(settings)
    families += [(f.name, f.type, f._labelnames) for f in CatalogCollector(settings).collect()]
    return {
        name + suffix: Sample(name, frozenset(labels) | ({"le"} if suffix == "_bucket" else set()))
        for name, kind, labels in families
        for suffix in SAMPLE_SUFFIXES[kind]
    }


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]
    out += [(v["name"], v["definition"]) for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def parse(expr: str):
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return promql_parser.parse(expr)  # raises on a query Prometheus would not parse


def _walk(node, kind) -> list:
    found = []
    promql_parser.walk(node, lambda n: found.append(n) if isinstance(n, kind) else None)
    return found


def selectors(expr: str) -> set[str]:
    """Metric names the expression reads (label_values(metric, label) for a variable's query)."""
    if match := re.fullmatch(r"label_values\((\w+),\s*\w+\)", expr):
        return {match[1]}
    return {v.name for v in _walk(parse(expr), promql_parser.VectorSelector)}


def label_problems(expr: str, defined: dict[str, Sample]) -> list[str]:
    """Labels the expression matches on or aggregates by that the metrics it reads do not have."""
    if match := re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", expr):
        return [] if match[2] in defined[match[1]].labels else [f"{match[1]} has no label {match[2]}"]
    problems = []
    for v in _walk(parse(expr), promql_parser.VectorSelector):
        for matcher in v.matchers.matchers:
            if matcher.name not in defined[v.name].labels | TARGET_LABELS:
                problems.append(f"{v.name} has no label {matcher.name}")
    for agg in _walk(parse(expr), promql_parser.AggregateExpr):
        have = set().union(*(defined[v.name].labels for v in _walk(agg.expr, promql_parser.VectorSelector)))
        problems += [
            f"by ({label}): not a label of what it aggregates"
            for label in agg.modifier.labels
            if label not in have | TARGET_LABELS
        ]
    return problems


def test_dashboard_has_grafanas_shape():
    dash = dashboard()
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area
        if p["type"] == "row":
            continue
        assert p["type"] == "timeseries" and p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_every_query_parses_and_reads_only_the_farms_metrics_and_labels(tmp_path):
    defined = defined_metrics(tmp_path)
    used = set()
    for title, expr in queries(dashboard()):
        names = selectors(expr)
        assert names, f"{title}: reads no metric"
        assert names <= set(defined), f"{title}: {names - set(defined)} is not a metric the farm defines"
        assert label_problems(expr, defined) == [], title
        used |= names
    # And the dashboard shows every metric family the farm has.
    assert {defined[n].family for n in used} == {s.family for s in defined.values()}


def test_legends_name_labels_the_query_keeps():
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            kept = set().union(*(a.modifier.labels for a in _walk(parse(target["expr"]), promql_parser.AggregateExpr)))
            assert set(re.findall(r"\{\{(\w+)\}\}", target["legendFormat"])) <= kept, panel["title"]


def test_panels_the_farm_needs_are_there():
    exprs = {title: expr for title, expr in queries(dashboard())}
    wanted = {
        "enginefarm_http_request_duration_seconds_count": "rate",
        "enginefarm_resolve_total": "outcome",
        "enginefarm_queue_depth": "target",
        "enginefarm_queue_oldest_age_seconds": "target",
        "enginefarm_build_seconds_count": "target",
        "enginefarm_tasks": "state",
        "enginefarm_workers_live": "target",
        "enginefarm_blob_store_errors_total": "store",
        "enginefarm_upload_bytes_total": "rate",
    }
    for metric, word in wanted.items():
        assert any(metric in e and word in e for e in exprs.values()), metric
    quantiles = {
        (m[1], m[2])
        for e in exprs.values()
        for m in re.finditer(r"histogram_quantile\((0\.\d+), sum by \(le, (\w+)\)", e)
    }
    assert {("0.5", "route"), ("0.99", "route"), ("0.5", "target"), ("0.95", "target")} <= quantiles
    # The catalog's gauges are the same on every API pod: panels take one, never the sum over pods.
    for e in exprs.values():
        for gauge in ("enginefarm_queue_depth", "enginefarm_tasks", "enginefarm_workers_live"):
            if re.search(rf"\b{gauge}\b", e) and not e.startswith("label_values"):
                assert e.startswith("max by"), e


def test_broken_queries_are_caught(tmp_path):
    with pytest.raises(ValueError):
        selectors("sum by (target (rate(enginefarm_build_seconds_count[5m]))")
    defined = defined_metrics(tmp_path)
    assert label_problems('sum by (tier) (rate(enginefarm_resolve_total{route="x"}[5m]))', defined) == [
        "enginefarm_resolve_total has no label route",
        "by (tier): not a label of what it aggregates",
    ]
