"""deploy/kubernetes/servicemonitor.yaml: the fields prometheus-operator requires of a
ServiceMonitor, and that it finds the DaemonSet's Service, port and token."""

import copy
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MONITOR = yaml.safe_load((REPO / "deploy" / "kubernetes" / "servicemonitor.yaml").read_text())
MANIFESTS = [d for d in yaml.safe_load_all(
    (REPO / "deploy" / "kubernetes" / "daemonset.yaml").read_text()) if d]
# prometheus-operator's Duration pattern (monitoring.coreos.com/v1 CRD)
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                      r"(([0-9]+)s)?(([0-9]+)ms)?)$")


def problems(monitor: dict) -> list[str]:
    """What the ServiceMonitor CRD's schema refuses (the parts this manifest uses)."""
    found = []
    if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
        found.append("apiVersion")
    if monitor.get("kind") != "ServiceMonitor":
        found.append("kind")
    if not monitor.get("metadata", {}).get("name"):
        found.append("metadata.name")
    spec = monitor.get("spec") or {}
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels")
                                              or selector.get("matchExpressions")):
        found.append("spec.selector")     # required; an empty one would match every Service
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        found.append("spec.endpoints")
    for n, endpoint in enumerate(endpoints or []):
        if not isinstance(endpoint.get("port"), str) and "targetPort" not in endpoint:
            found.append(f"endpoints[{n}].port")
        if not str(endpoint.get("path", "/")).startswith("/"):
            found.append(f"endpoints[{n}].path")
        for key in ("interval", "scrapeTimeout"):
            if key in endpoint and not DURATION.match(str(endpoint[key])):
                found.append(f"endpoints[{n}].{key}")
        auth = endpoint.get("authorization")
        if auth is not None and not {"name", "key"} <= set(auth.get("credentials", {})):
            found.append(f"endpoints[{n}].authorization.credentials")
    return found


def _service():
    return next(d for d in MANIFESTS if d["kind"] == "Service")


def test_the_fields_prometheus_operator_requires():
    assert problems(MONITOR) == []
    [endpoint] = MONITOR["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"


def test_the_checker_refuses_what_the_operator_refuses():
    for broken, expected in (({"apiVersion": "monitoring.coreos.com/v1alpha1"}, "apiVersion"),
                             ({"spec": {"endpoints": MONITOR["spec"]["endpoints"]}},
                              "spec.selector")):
        monitor = {**copy.deepcopy(MONITOR), **broken}
        assert expected in problems(monitor)
    monitor = copy.deepcopy(MONITOR)
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    assert problems(monitor) == ["endpoints[0].interval"]


def test_it_finds_the_daemonsets_service_port_and_token():
    service = _service()
    spec = MONITOR["spec"]
    assert MONITOR["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert spec["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert spec["endpoints"][0]["port"] in ports
    # the job label is "gpuwhy", which the shipped rules' GpuwhyTargetDown selects
    assert service["metadata"]["labels"][spec["jobLabel"]] == "gpuwhy"
    [serve] = [c for d in MANIFESTS if d["kind"] == "DaemonSet"
               for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "serve"]
    env = {e["name"]: e for e in serve["env"]}
    token = env["GPUWHY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert spec["endpoints"][0]["authorization"]["credentials"] == token
    assert env["GPUWHY_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
