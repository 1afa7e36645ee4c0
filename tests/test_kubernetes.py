"""deploy/kubernetes/daemonset.yaml: valid against the Kubernetes schema, and what it promises."""

import copy
from pathlib import Path

import click
import kubernetes_validate
import pytest
import yaml

from gpuwhy.app.cli import cli
from gpuwhy.caps import PROBE_CAPABILITIES
from gpuwhy.config import SETTINGS

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "daemonset.yaml"
DOCS = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
# the oldest Kubernetes still commonly run, and the newest schema the validator bundles
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def _daemonsets():
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "DaemonSet"}


def _daemonset(name="gpuwhy-probes"):
    return _daemonsets()[name]


def _pod(name):
    return _daemonset(name)["spec"]["template"]["spec"]


def _containers():
    return {c["name"]: c for d in _daemonsets().values()
            for c in d["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d["kind"])
def test_valid_against_the_kubernetes_schema(doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_broken_manifest():
    broken = copy.deepcopy(_daemonset())
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = False
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
    broken = copy.deepcopy(_daemonset())
    broken["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_capabilities_instead_of_privileged():
    containers = _containers()
    assert set(containers) == {"probes", "stacks", "serve"}
    for container in containers.values():
        context = container["securityContext"]
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
    added = containers["probes"]["securityContext"]["capabilities"]["add"]
    assert ["CAP_" + c for c in added] == list(PROBE_CAPABILITIES)   # the unit's, exactly
    assert "add" not in containers["serve"]["securityContext"]["capabilities"]
    # the stack sampler: CAP_SYS_PTRACE alone, as systemd/gpuwhy-stacks.service; read-only
    # on the bus volume (the targets file, the socket) and a /tmp of its own
    sampler = containers["stacks"]
    assert sampler["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE"]
    mounts = {m["mountPath"]: m for m in sampler["volumeMounts"]}
    assert mounts["/run/gpuwhy"]["readOnly"] is True and mounts["/tmp"]["name"] == "stacks-tmp"
    assert [c["args"] for c in containers.values()] == [["probes"], ["probes", "--only",
                                                                     "stacks"], ["serve"]]
    assert {"probes", "serve"} <= set(cli.list_commands(click.Context(cli)))


def _mebibytes(quantity: str) -> int:
    return int(quantity[:-2]) * {"Mi": 1, "Gi": 1024}[quantity[-2:]]


def test_memory_limits_match_the_units_budgets():
    """Each container's limit is its unit's MemoryMax= (#54: measured, then budgeted)."""
    units = Path(__file__).resolve().parent.parent / "systemd"
    for name, unit in (("probes", "gpuwhy-probes.service"), ("serve", "gpuwhy.service"),
                       ("stacks", "gpuwhy-stacks.service")):
        limit = _containers()[name]["resources"]["limits"]["memory"]
        max_line = next(line for line in (units / unit).read_text().splitlines()
                        if line.startswith("MemoryMax="))
        assert limit.removesuffix("i") == max_line.partition("=")[2], (name, limit, max_line)
        request = _containers()[name]["resources"]["requests"]["memory"]
        assert _mebibytes(request) <= _mebibytes(limit), (name, request, limit)
    added = _containers()["probes"]["securityContext"]["capabilities"]["add"]
    assert "SYS_RESOURCE" not in added


def test_host_pid_for_the_probes_pod_only_and_read_only_host_mounts():
    """#54: the probes and the stack sampler in the host's pid namespace, `serve` in a pod
    of its own without it; the two pods share the bus through the node's /run/gpuwhy."""
    assert set(_daemonsets()) == {"gpuwhy-probes", "gpuwhy"}
    assert _pod("gpuwhy-probes")["hostPID"] is True
    assert "hostPID" not in _pod("gpuwhy") and \
        {c["name"] for c in _pod("gpuwhy")["containers"]} == {"serve"}
    every = set()
    for name in _daemonsets():
        spec = _pod(name)
        host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]
                      if "hostPath" in v}
        assert host_paths["bus"] == "/run/gpuwhy", name       # one socket for both pods
        every |= set(host_paths.values())
        for container in spec["containers"]:
            for mount in container["volumeMounts"]:
                if mount["name"] in host_paths and \
                        host_paths[mount["name"]] not in ("/var/lib/gpuwhy", "/run/gpuwhy"):
                    assert mount.get("readOnly") is True, (container["name"], mount)
    assert {"/proc", "/sys/kernel/btf", "/sys/kernel/tracing", "/dev", "/var/log/journal",
            "/lib/modules"} <= every
    # the pods' labels tell them apart: each DaemonSet selects its own pods only
    selectors = [d["spec"]["selector"]["matchLabels"] for d in _daemonsets().values()]
    assert selectors[0] != selectors[1]
    mounts = {m["mountPath"] for m in _containers()["probes"]["volumeMounts"]}
    # the probes read these at fixed paths (gpuwhy.probes.btf, fdtrack's tracefs, bcc)
    assert {"/sys/kernel/btf", "/sys/kernel/tracing", "/lib/modules", "/run/gpuwhy"} <= mounts


def test_every_variable_is_a_setting_and_points_at_a_mount():
    known = {s.env for s in SETTINGS}
    for container in _containers().values():
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for name, value in env.items():
            assert name in known or name.startswith("NVIDIA_"), name
            if name in ("GPUWHY_PROC_ROOT", "GPUWHY_KLOG_JOURNAL", "GPUWHY_CRON_ETC"):
                assert any(value == m or m.startswith(value + "/") for m in mounts), name
        assert env["GPUWHY_BUS"] == "ipc:///run/gpuwhy/bus.sock"


def test_gpu_tolerations_and_the_web_port():
    for name in _daemonsets():
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            _pod(name)["tolerations"]
    # NVML in `serve` comes from NVIDIA's runtime; the probes need none of it
    assert _pod("gpuwhy")["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in _pod("gpuwhy-probes")
    serve = _containers()["serve"]
    env = {e["name"]: e for e in serve["env"]}
    assert serve["ports"] == [{"name": "http", "containerPort": int(env["GPUWHY_PORT"]["value"]),
                               "protocol": "TCP"}]
    # beyond loopback the web view (and /metrics) needs the token: it comes from a Secret
    assert env["GPUWHY_HOST"]["value"] == "0.0.0.0"
    assert "secretKeyRef" in env["GPUWHY_AUTH_TOKEN"]["valueFrom"]
    service = next(d for d in DOCS if d["kind"] == "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"] == _daemonset("gpuwhy")["spec"]["selector"]["matchLabels"]
