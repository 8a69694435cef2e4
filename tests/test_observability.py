"""deploy/prometheus and deploy/grafana: the alert rules and the dashboard an operator installs.

* ``promtool check rules`` accepts deploy/prometheus/rules.yaml and ``promtool test rules`` runs its
  unit tests (each alert fires on a case and stays quiet on another); Debian's ``prometheus``
  package ships promtool (.ci/run installs it);
* every PromQL expression of the dashboard parses (promtool, as recording rules);
* the dashboard has the rows docs/operations.md describes;
* every metric the dashboard, the alerts and the chart's KEDA trigger query is exported by the
  ``/metrics`` of a real running service, with the labels the queries group or match on.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "argusdiff.json"

# labels Prometheus adds at scrape time or that histograms carry
_SCRAPE_LABELS = {"instance", "job", "le", "namespace", "pod"}
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return path


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", ())]


def _rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def _as_promql(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced by what Grafana gives them."""
    return expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")


def queried_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\bargusdiff_[a-z_]+\b", expr))


def family_of(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def queried_labels(expr: str) -> dict[str, set[str]]:
    """Metric -> label names the expression matches on ({a="x"}) or groups the metric by (by (a, b))."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"\b(argusdiff_[a-z_]+)\s*\{([^}]*)\}", expr):
        out.setdefault(m[1], set()).update(re.findall(r"([a-z_]+)\s*(?:=~|!=|!~|=)", m[2]))
    for m in re.finditer(r"\bby\s*\(([^)]*)\)\s*\(([^()]*(?:\([^()]*\))?[^()]*)\)", expr):
        labels = {s.strip() for s in m[1].split(",") if s.strip()}
        for metric in queried_metrics(m[2]):
            out.setdefault(metric, set()).update(labels)
    return out


@pytest.mark.integration
def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    n = len(_rule_exprs())
    assert f"SUCCESS: {n} rules found" in check.stdout
    unit = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True, timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for t in case.get("alert_rule_test", ()):
            (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    assert alerts == fires == quiet, (alerts - fires, alerts - quiet)


@pytest.mark.integration
def test_promtool_parses_every_dashboard_query(tmp_path):
    promtool = _promtool()
    rules = [{"record": f"argusdiff:dashboard:{i}", "expr": _as_promql(e)} for i, e in enumerate(_dashboard_exprs())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_has_the_rows_and_a_sound_layout():
    dash = _dashboard()
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Traffic", "Latency against the SLO", "The plan", "Queues", "Latent cache", "Control plane"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
    # the series the issue asks for, each in some panel
    exprs = "\n".join(_dashboard_exprs())
    for needle in ('status="499"', "argusdiff_refused_total", "argusdiff_slo_seconds", "argusdiff_capacity_qpm",
                   "argusdiff_desired_workers", "argusdiff_workers_up", "argusdiff_queue_backlog",
                   "argusdiff_queue_depth_by_tier", "argusdiff_cache_hit_ratio", "argusdiff_strategy",
                   "argusdiff_leader_token", "argusdiff_plan_version", "argusdiff_plan_changes_total",
                   "argusdiff_level_latency_seconds"):  # fmt: skip
        assert needle in exprs, needle


@pytest.fixture(scope="module")
def scraped():
    """The metric families (name -> label names seen) of a real service after some traffic."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from argusdiff.service.app import Service
    from tests.fixtures_service import LiveServer, service_settings

    server = LiveServer(Service(service_settings(stand_in_scale=0.0005))).start()
    try:
        for i in range(4):
            r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": f"a red fox {i}"}, timeout=60)
            assert r.status_code == 200, r.text
        assert httpx.get(f"{server.url}/nope", timeout=10).status_code == 404
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    families: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        labels = families.setdefault(family_of(fam.name), set())
        for s in fam.samples:
            labels.update(s.labels)
    return families


def _chart_queries() -> list[str]:
    values = ROOT / "deploy" / "helm" / "argusdiff" / "values.yaml"
    if not values.exists():
        return []
    text = values.read_text(encoding="utf-8")
    return [m for m in re.findall(r"query:\s*(.+)", text)]


@pytest.mark.integration
def test_every_queried_metric_is_exported_by_a_running_service(service_env, scraped):
    exprs = _dashboard_exprs() + _rule_exprs() + _chart_queries()
    missing: dict[str, list[str]] = {}
    for expr in exprs:
        for name in queried_metrics(expr):
            if family_of(name) not in scraped:
                missing.setdefault(name, []).append(expr)
    assert not missing, f"queried but not exported by /metrics: {sorted(missing)}"
    # the labels queries match or group on exist on the series (families with samples only: a
    # labelled metric shows its label names once it has a child)
    wrong = {}
    for expr in exprs:
        for name, labels in queried_labels(expr).items():
            seen = scraped[family_of(name)]
            if seen:
                extra = labels - seen - _SCRAPE_LABELS
                if extra:
                    wrong[name] = extra
    assert not wrong, f"labels not on the exported series: {wrong}"


def test_label_extraction_reads_matchers_and_grouping():
    got = queried_labels('sum by (level, tier) (argusdiff_queue_depth_by_tier{tier="batch"})')
    assert got == {"argusdiff_queue_depth_by_tier": {"level", "tier"}}
    assert family_of("argusdiff_request_latency_seconds_bucket") == "argusdiff_request_latency_seconds"
