"""`gpuwhy check-env` and scripts/check-env.sh: the real state of this host, and fake ones."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.deploy import checkenv
from gpuwhy.app.deploy.checkenv import (
    Host,
    check_bpf,
    check_disk,
    check_driver,
    dcgm_driver_mismatch,
)
from gpuwhy.app.deploy.envfixes import FAMILIES, Distro
from gpuwhy.config import load_config

REPO = Path(__file__).resolve().parent.parent
KERNEL = os.uname().release


def _run(*args):
    return CliRunner().invoke(cli, ["check-env", *args], catch_exceptions=False)


def _expected_states() -> dict[str, str]:
    """This host's state for each check, found here by other means than checkenv's."""
    build = Path(f"/lib/modules/{KERNEL}/build")
    try:
        uts = (build / "include/generated/utsrelease.h").read_text()
    except OSError:
        uts = ""
    return {
        "nvidia-driver": "ok" if Path("/sys/module/nvidia").exists() else "fail",
        "kernel-btf": "ok" if Path("/sys/kernel/btf/vmlinux").exists() else "fail",
        "kernel-headers": "fail" if not (build / "include").is_dir()
        else "ok" if f'"{KERNEL}"' in uts else "warn",
        "bcc": "ok" if importlib.util.find_spec("bcc") else "fail",
        "tracefs": "ok" if Path("/sys/kernel/tracing/events").is_dir()
        or Path("/sys/kernel/debug/tracing/events").is_dir() else "fail",
        "bpf": "ok" if os.geteuid() == 0 else "fail",
        "python": "ok",
        "disk": "ok" if shutil.disk_usage("/var/lib" if not Path("/var/lib/gpuwhy").exists()
                                          else "/var/lib/gpuwhy").free > 2 << 30 else "warn",
    }


def test_this_host_has_no_driver_and_says_how_to_install_it():
    result = _run()
    assert result.exit_code == 1
    assert "FAIL  nvidia-driver   no NVIDIA driver" in result.output
    for family in FAMILIES:
        assert f"fix, {family}" in result.output
    assert "cuda-drivers" in result.output and "ubuntu-drivers install" in result.output
    assert result.output.rstrip().endswith("NOT ready: fix the FAIL lines above")


def test_every_other_check_reports_the_real_state():
    result = _run("--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    states = {c["name"]: c["state"] for c in report["checks"]}
    assert report["ok"] is False
    for name, state in _expected_states().items():
        assert states[name] == state, (name, report)
    checks = {c["name"]: c for c in report["checks"]}
    assert "libnvidia-ml.so.1" in checks["nvml"]["detail"] and states["nvml"] == "fail"
    assert states["dcgm"] == "warn" and "gpuwhy falls back to NVML" in checks["dcgm"]["detail"]
    for check in report["checks"]:
        assert (check["state"] == "ok") == (check["fix"] == {}), check
        assert set(check["fix"]) in (set(), set(FAMILIES)), check
    assert report["host"]["family"] == Distro.read().family


def test_the_shell_script_is_the_same_check(tmp_path):
    script = subprocess.run([str(REPO / "scripts/check-env.sh"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert script.returncode == 1, script.stderr
    ours = json.loads(_run("--json").output)
    theirs = json.loads(script.stdout)
    assert [(c["name"], c["state"]) for c in theirs["checks"]] == \
        [(c["name"], c["state"]) for c in ours["checks"]]


def test_the_shell_script_runs_before_install_from_a_bare_checkout(tmp_path):
    for folder in ("gpuwhy", "probes", "scripts"):
        shutil.copytree(REPO / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([str(tmp_path / "scripts/check-env.sh")], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "GPUWHY": ""})
    assert result.returncode == 1, result.stderr
    assert "FAIL  nvidia-driver   no NVIDIA driver" in result.stdout
    assert "ok    kernel-btf" in result.stdout or "FAIL  kernel-btf" in result.stdout
    assert "(/usr/bin/python3" in result.stdout     # the distribution's python, bcc's


def test_bad_option_is_a_usage_error():
    result = subprocess.run([str(REPO / "scripts/check-env.sh"), "--jsn"], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "unknown option '--jsn'" in result.stderr


def _host(tmp_path, **files) -> Host:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Host(root=tmp_path, config=load_config(environ={}), distro=Distro("debian", "12", "x"),
                machine="x86_64", kernel="6.8.0")


def test_a_loaded_driver_is_found(tmp_path):
    host = _host(tmp_path, **{"sys/module/nvidia/version": "550.54.15\n", "dev/nvidia0": ""})
    check, version = check_driver(host)
    assert version == "550.54.15" and check.state == "ok" and "nvidia0" in check.detail
    host = _host(tmp_path / "b", **{"proc/driver/nvidia/version":
                                    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "
                                    "580.65.06  Sun Jul 27 07:09:29 UTC 2025\n"})
    check, version = check_driver(host)
    assert version == "580.65.06" and check.state == "warn"     # no /dev/nvidiaN


@pytest.mark.parametrize(("packages", "driver", "problem"), [
    ({"datacenter-gpu-manager-4-core": "4.4.1", "datacenter-gpu-manager-4-cuda12": "4.4.1"},
     "580.65.06", "datacenter-gpu-manager-4-cuda13 is needed"),
    ({"datacenter-gpu-manager-4-cuda13": "4.4.1"}, "580.65.06", None),
    ({"datacenter-gpu-manager-4-cuda12": "4.2.3"}, "550.54.15", None),
    ({"datacenter-gpu-manager-4-cuda12": "4.2.3"}, "470.82.01", "cuda11 is needed"),
    ({"datacenter-gpu-manager-4-core": "4.2.3"}, "440.33.01", "needs driver R450"),
    ({"datacenter-gpu-manager": "3.3.6"}, "535.104.05", None),
])
def test_dcgm_must_match_the_drivers_cuda(packages, driver, problem):
    found = dcgm_driver_mismatch(packages, driver)
    assert found is None if problem is None else problem in found


def test_a_mismatched_dcgm_fails_with_the_right_package(tmp_path):
    host = _host(tmp_path)
    check = checkenv.check_dcgm(host, "580.65.06",
                                packages={"datacenter-gpu-manager-4-cuda12": "4.4.1"})
    assert check.state == "fail"
    assert "apt-get install -y datacenter-gpu-manager-4-cuda13" in check.fix["debian"]
    assert "dnf install -y datacenter-gpu-manager-4-cuda13" in check.fix["rhel"]


def test_missing_btf_tracefs_and_bpf_fail_with_their_fixes(tmp_path):
    host = _host(tmp_path)
    assert checkenv.check_btf(host).state == "fail"
    tracefs = checkenv.check_tracefs(host)
    assert tracefs.state == "fail" and tracefs.fix["rhel"].startswith("mount -t tracefs")
    assert check_bpf(host, held=set()).detail.startswith("the kernel has no bpf()")
    host = _host(tmp_path, **{"proc/sys/kernel/unprivileged_bpf_disabled": "2\n"})
    assert check_bpf(host, held={"CAP_DAC_READ_SEARCH"}).state == "fail"
    everything = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_RESOURCE", "CAP_DAC_READ_SEARCH",
                  "CAP_SYS_PTRACE"}
    assert check_bpf(host, held=everything).state == "ok"
    partial = check_bpf(host, held=everything - {"CAP_SYS_PTRACE"})
    assert partial.state == "warn" and "environ" in partial.detail
    host = _host(tmp_path, **{"sys/kernel/security/lockdown":
                              "none integrity [confidentiality]\n"})
    assert check_bpf(host, held=everything).state == "fail"


def test_an_old_kernel_is_told_about_the_memlock_limit(tmp_path):
    """Before 5.11 BPF maps count against RLIMIT_MEMLOCK, which the units lift; the probes
    no longer ask for CAP_SYS_RESOURCE, so an old kernel is told what it needs instead."""
    needed = {"CAP_BPF", "CAP_PERFMON", "CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"}
    host = _host(tmp_path, **{"proc/sys/kernel/unprivileged_bpf_disabled": "2\n"})
    assert check_bpf(host, held=needed).detail.endswith("CAP_SYS_PTRACE")   # 6.8: no note
    old = Host(root=tmp_path, config=host.config, distro=host.distro, machine="x86_64",
               kernel="5.10.0-28-amd64")
    told = check_bpf(old, held=needed)
    assert told.state == "ok" and "RLIMIT_MEMLOCK" in told.detail
    assert "RLIMIT_MEMLOCK" not in check_bpf(old, held=needed | {"CAP_SYS_RESOURCE"}).detail


def test_headers_for_another_kernel_warn(tmp_path):
    host = _host(tmp_path, **{"lib/modules/6.8.0/build/include/generated/utsrelease.h":
                              '#define UTS_RELEASE "6.1.0-57-amd64"\n'})
    assert checkenv.check_headers(host).state == "warn"
    host = _host(tmp_path / "b", **{"lib/modules/6.8.0/build/include/generated/utsrelease.h":
                                    '#define UTS_RELEASE "6.8.0"\n'})
    assert checkenv.check_headers(host).state == "ok"
    assert checkenv.check_headers(_host(tmp_path / "c")).state == "fail"


def test_little_free_disk_fails(tmp_path, monkeypatch):
    host = _host(tmp_path)
    monkeypatch.setattr(checkenv.shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 100 << 20))
    check = check_disk(host)
    assert check.state == "fail" and "GPUWHY_DB" in check.fix["ubuntu"]


@pytest.mark.parametrize(("os_release", "family", "repo"), [
    ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n', "ubuntu", "ubuntu2204"),
    ('ID=debian\nVERSION_ID="12"\n', "debian", "debian12"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n', "rhel", "rhel9"),
    ('ID=linuxmint\nID_LIKE="ubuntu debian"\nVERSION_ID="21.3"\n', "ubuntu", None),
    ('ID=arch\n', "", None),
])
def test_distribution_families(tmp_path, os_release, family, repo):
    (tmp_path / "os-release").write_text(os_release)
    distro = Distro.read(tmp_path / "os-release")
    assert distro.family == family
    if repo:
        assert distro.cuda_repo(family) == repo


def test_python_is_checked_against_the_projects_minimum():
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=" + ".".join(
        map(str, checkenv.MIN_PYTHON))
    assert checkenv.check_python().detail.startswith(".".join(map(str, sys.version_info[:3])))
