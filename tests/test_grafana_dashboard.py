"""deploy/grafana: the dashboard is valid JSON of the panel types it may use, every query
reads a metric gpuwhy's real /metrics serves (or a recording rule of deploy/prometheus),
and the provisioning file beside it says where Grafana finds it."""

import json
import re
from pathlib import Path

import yaml

from gpuwhy.config import load_config
from gpuwhy.store import open_store
from gpuwhy.webui import create_app

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana" / "gpuwhy.json"
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning.yml"
RULES = REPO / "deploy" / "prometheus" / "gpuwhy-rules.yml"
# Grafana's core panel types this dashboard may use (no plugin to install)
PANEL_TYPES = {"row", "timeseries", "stat", "table", "bargauge", "gauge", "state-timeline",
               "text", "heatmap"}
# what Prometheus itself serves beside gpuwhy's series
PROMETHEUS_OWN = {"ALERTS", "up"}
# PromQL words that look like metric names
PROMQL = {"sum", "by", "count", "or", "vector", "topk", "rate", "increase", "and", "on",
          "without", "max", "min", "avg", "label_values", "unless", "offset", "bool"}


def served_metric_names(tmp_path) -> set[str]:
    """Every sample name gpuwhy's real /metrics declares (a fresh store)."""
    path = tmp_path / "gpuwhy.db"
    open_store(path).close()
    client = create_app(load_config(environ={"GPUWHY_DB": str(path)})).test_client()
    return set(re.findall(r"^# TYPE (\S+) ", client.get("/metrics").data.decode(), re.M))


def _panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers not followed by ``(`` outside
    braces, strings and ranges."""
    bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', " ", expr)
    bare = re.sub(r"label_values\(([^,]*),\s*\w+\)", r"\1", bare)   # (metric, label)
    names = set(re.findall(r"(?<![\w:])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", bare))
    grouped = set(re.findall(r"(?:by|on|without)\s*\(([^)]*)\)", bare))
    labels = {x.strip() for g in grouped for x in g.split(",")}
    return {n for n in names if n not in PROMQL and n not in labels and not n.isdigit()
            and not re.fullmatch(r"\d+[smhd]?", n)}


def _queries(dashboard):
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield var["name"], var["query"]["query"]
    for note in dashboard["annotations"]["list"]:
        yield note["name"], note["expr"]


def test_panels_are_known_types_with_unique_ids_and_a_place():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(_panels(dashboard))
    assert {p["type"] for p in panels} <= PANEL_TYPES
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and len(ids) >= 20
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Fleet", "Host $host", "GPU $gpu"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "host", "instance", "gpu"}
    assert variables["datasource"]["type"] == "datasource"


def test_every_query_reads_a_served_metric_or_a_recording_rule(tmp_path):
    served = served_metric_names(tmp_path)
    records = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"]
               for r in g["rules"] if "record" in r}
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for title, expr in _queries(dashboard):
        names = metric_names(expr)
        assert names, (title, expr)
        unknown = names - served - records - PROMETHEUS_OWN
        assert not unknown, (title, expr, unknown)
        used |= names
    # the fleet view needs the health, idle share and open incidents
    assert {"gpuwhy_gpu_health", "gpuwhy:gpu_idle_share:avg5m", "gpuwhy_incidents_open"} <= used


def test_the_name_check_catches_an_unknown_metric(tmp_path):
    served = served_metric_names(tmp_path)
    assert metric_names('sum by (kind) (gpuwhy_incidents_open{instance=~"$x"})') == \
        {"gpuwhy_incidents_open"}
    assert metric_names("rate(gpuwhy_gpu_energy_joule_total[5m])") - served == \
        {"gpuwhy_gpu_energy_joule_total"}


def test_provisioning_points_at_a_folder_of_dashboards():
    provisioning = yaml.safe_load(PROVISIONING.read_text())
    assert provisioning["apiVersion"] == 1
    [provider] = provisioning["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert json.loads(DASHBOARD.read_text())["uid"] == "gpuwhy-fleet"
