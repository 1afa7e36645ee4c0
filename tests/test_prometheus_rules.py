"""deploy/prometheus: the real promtool checks the rules and runs their unit tests; every
alert has its annotations, a runbook anchor in docs/alerts.md and a unit test that fires
it; every metric the rules read is one gpuwhy's /metrics serves; labels stay bounded."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwhy.config import load_config
from gpuwhy.store import open_store
from gpuwhy.webui import create_app

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpuwhy-rules.yml"
TESTS = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.yml"))
ANNOTATIONS = {"summary", "description", "runbook_url", "incident_url"}
# labels that would make a series (or an alert) per process: never in a rule's output
UNBOUNDED = {"pid", "start_time", "comm", "cmdline"}


def _rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _alerts():
    return [r for r in _rules() if "alert" in r]


def served_metric_names(tmp_path) -> set[str]:
    """Every sample name gpuwhy's real /metrics declares (a fresh store: families are
    declared even before they have series)."""
    path = tmp_path / "gpuwhy.db"
    open_store(path).close()
    client = create_app(load_config(environ={"GPUWHY_DB": str(path)})).test_client()
    text = client.get("/metrics").data.decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def test_promtool_checks_the_rules(installed):
    promtool = installed("promtool")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path, installed):
    promtool = installed("promtool")
    broken = yaml.safe_load(RULES.read_text())
    broken["groups"][1]["rules"][0]["expr"] = "gpuwhy_gpu_health{state=\"lost\" == 1"
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0


@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file, installed):
    promtool = installed("promtool")
    result = subprocess.run([promtool, "test", "rules", test_file.name], capture_output=True,
                            text=True, timeout=120, cwd=test_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_fires_in_a_unit_test_and_has_a_runbook_anchor():
    fired = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    headings = re.findall(r"^## (\S+)$", (REPO / "docs" / "alerts.md").read_text(), re.M)
    anchors = {h.lower() for h in headings}
    names = [a["alert"] for a in _alerts()]
    assert len(names) >= 10 and len(set(names)) == len(names)
    assert set(names) <= fired, set(names) - fired
    for alert in _alerts():
        assert set(alert["annotations"]) >= ANNOTATIONS, alert["alert"]
        runbook = alert["annotations"]["runbook_url"]
        assert runbook == f"docs/alerts.md#{alert['alert'].lower()}"
        assert runbook.split("#")[1] in anchors, alert["alert"]
        assert "{{ $labels.instance }}" in alert["annotations"]["incident_url"]
        # the alert's severity is its own label or the series' (Xids, findings)
        assert "severity" in alert.get("labels", {}) or "severity" in alert["expr"]
    assert set(anchors) == {n.lower() for n in names}   # no runbook for a missing alert


def test_rules_read_only_metrics_gpuwhy_serves_and_stay_bounded(tmp_path):
    served = served_metric_names(tmp_path) | {"up"}
    records = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        expr = rule["expr"]
        names = set(re.findall(r"\b((?:gpuwhy_|up\b)[a-z0-9_]*)", expr))
        assert names, expr
        assert names <= served | records, (names - served - records)
        words = set(re.findall(r"[A-Za-z_]+", expr))
        assert not words & UNBOUNDED, (rule.get("record") or rule["alert"], words & UNBOUNDED)
        grouped = re.findall(r"\bby \(([^)]*)\)", expr)
        for labels in grouped:
            assert not {x.strip() for x in labels.split(",")} & UNBOUNDED, expr
