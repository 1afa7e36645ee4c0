"""Check that this host can run gpuwhy, and say how to fix each thing that is missing.

NVIDIA driver, DCGM (and whether its CUDA flavour matches the driver), NVML, kernel BTF
and headers for bcc, tracefs, BPF and the probes' capabilities, Python, free disk. Each
check is ok, warn (gpuwhy runs, with less) or fail (a part of gpuwhy cannot run); each
one that is not ok carries the fix for Debian, Ubuntu and RHEL-family hosts. GPU
detection reuses the GPU sources themselves (:mod:`gpuwhy.probes.gpu`), BTF parsing
:mod:`gpuwhy.probes.btf`, capabilities :mod:`gpuwhy.caps`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuwhy.app.deploy import envfixes
from gpuwhy.app.deploy.envfixes import Distro
from gpuwhy.caps import PROBE_CAPABILITIES, can_load_bpf, effective_capabilities
from gpuwhy.config import load_config

MIN_PYTHON = (3, 11)
DISK_FAIL_BYTES = 256 << 20
DISK_WARN_BYTES = 2 << 30
MEMLOCK_ACCOUNTING_KERNEL = (5, 11)   # BPF memory is charged to the cgroup from here on
# DCGM 4 ships one package per CUDA major; the driver branch decides which one works.
CUDA_MAJOR_FROM_DRIVER = ((580, 13), (525, 12), (450, 11))
DCGM_MIN_DRIVER = 450


@dataclass
class Check:
    """One finding: ``state`` is ok, warn or fail; ``fix`` maps a family to a command."""

    name: str
    state: str
    detail: str
    fix: dict[str, str] = field(default_factory=dict)


@dataclass
class Host:
    """Where the checks look: a root directory (tests pass a fake one) and the config."""

    root: Path = Path("/")
    config: Mapping[str, Any] = field(default_factory=load_config)
    distro: Distro = field(default_factory=lambda: Distro.read())
    machine: str = field(default_factory=lambda: os.uname().machine)
    kernel: str = field(default_factory=lambda: os.uname().release)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def source_config(self) -> Mapping[str, Any]:
        """The config for opening a GPU source only to look: /proc under our root, and never
        an embedded DCGM hostengine."""
        return {**self.config, "probes.proc_root": str(self.path("proc")),
                "gpu.dcgm_embedded": "never"}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)[:3])


def driver_version(host: Host) -> str | None:
    """The loaded NVIDIA kernel module's version, e.g. '550.54.15'; None when not loaded."""
    for name in ("sys/module/nvidia/version", "proc/driver/nvidia/version"):
        try:
            text = host.path(name).read_text()
        except OSError:
            continue
        match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
        if match:
            return match.group(1)
    return None


def cuda_major_for_driver(version: str) -> int:
    major = _version_tuple(version)[0]
    return next((cuda for branch, cuda in CUDA_MAJOR_FROM_DRIVER if major >= branch), 11)


def check_driver(host: Host) -> tuple[Check, str | None]:
    version = driver_version(host)
    if version is None:
        return Check("nvidia-driver", "fail", "no NVIDIA driver (no /sys/module/nvidia/version; "
                     "the nvidia kernel module is not loaded)",
                     envfixes.nvidia_driver(host.distro, host.machine)), None
    devices = sorted(p.name for p in host.path("dev").glob("nvidia[0-9]*"))
    detail = f"{version}; devices: {', '.join(devices) or 'none (no /dev/nvidiaN)'}"
    return Check("nvidia-driver", "ok" if devices else "warn", detail), version


def check_nvml(host: Host, driver: str | None) -> Check:
    from gpuwhy.probes.gpu.select import make_source
    from gpuwhy.probes.gpu.source import SourceUnavailable

    source = make_source("nvml", host.source_config())
    try:
        gpus = source.open()
    except SourceUnavailable as exc:
        if "pynvml" in exc.reason:
            fix = envfixes.same_everywhere(f"{sys.executable} -m pip install nvidia-ml-py")
        elif "mismatch" in exc.reason:
            fix = envfixes.same_everywhere("reboot   # the driver was upgraded, the old one "
                                           "is still loaded")
        elif driver is None:      # NVML comes with the driver
            fix = envfixes.nvidia_driver(host.distro, host.machine)
        else:
            fix = envfixes.nvml_library(_version_tuple(driver)[0])
        return Check("nvml", "fail", exc.reason, fix)
    try:
        return Check("nvml", "ok", f"{len(gpus)} GPU(s): " + ", ".join(
            f"{g.model} ({g.id})" for g in gpus))
    finally:
        source.close()


def _installed_dcgm_packages() -> dict[str, str]:
    """``{package: version}`` of DCGM packages, from dpkg or rpm (whichever this host has)."""
    commands = (["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package} ${Version}\\n",
                 "datacenter-gpu-manager*"],
                ["rpm", "-qa", "--qf", "ii %{NAME} %{VERSION}\\n", "datacenter-gpu-manager*"])
    for command in commands:
        if shutil.which(command[0]) is None:
            continue
        result = subprocess.run(command, capture_output=True, text=True, timeout=20)
        packages = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith("ii"):
                packages[parts[1]] = parts[2].split(":")[-1]
        return packages
    return {}


def dcgm_driver_mismatch(packages: dict[str, str], driver: str) -> str | None:
    """Why the installed DCGM packages cannot work with ``driver``; None when they can."""
    if _version_tuple(driver)[0] < DCGM_MIN_DRIVER:
        return f"DCGM needs driver R{DCGM_MIN_DRIVER} or later, this host has {driver}"
    needed = cuda_major_for_driver(driver)
    flavours = {int(m.group(1)) for name in packages
                if (m := re.fullmatch(r"datacenter-gpu-manager-4-cuda(\d+)", name))}
    if flavours and needed not in flavours:
        have = ", ".join(f"cuda{f}" for f in sorted(flavours))
        return (f"DCGM is installed for {have} but driver {driver} runs CUDA {needed}: "
                f"datacenter-gpu-manager-4-cuda{needed} is needed")
    return None


def check_dcgm(host: Host, driver: str | None,
               packages: dict[str, str] | None = None) -> Check:
    from gpuwhy.probes.gpu.source import SourceUnavailable

    packages = _installed_dcgm_packages() if packages is None else packages
    cuda = cuda_major_for_driver(driver) if driver else 12
    install = envfixes.dcgm(host.distro, host.machine, cuda)
    version = next((v for p, v in sorted(packages.items()) if p.endswith("-core")),
                   next(iter(packages.values()), None))
    if driver and packages and (why := dcgm_driver_mismatch(packages, driver)):
        return Check("dcgm", "fail", f"{why} (installed: {', '.join(sorted(packages))})",
                     install)
    from gpuwhy.probes.gpu.select import make_source

    try:
        source: Any = make_source("dcgm", host.source_config())    # a DcgmSource: .mode
    except ImportError as exc:       # scripts/check-env.sh before install: no psutil yet
        return Check("dcgm", "warn", f"not checked ({exc}); packages: "
                     f"{', '.join(sorted(packages)) or 'none'}", install)
    try:
        gpus = source.open()
    except SourceUnavailable as exc:
        state = "fail" if packages and driver else "warn"   # else NVML stands in for it
        found = f"DCGM {version} installed; " if version else ""
        return Check("dcgm", state, f"{found}{exc.reason}; gpuwhy falls back to NVML", install)
    try:
        return Check("dcgm", "ok", f"DCGM {version or '(version unknown)'}, {source.mode}, "
                     f"{len(gpus)} GPU(s)")
    finally:
        source.close()


def check_btf(host: Host) -> Check:
    from gpuwhy.probes.btf import BTFError, task_offsets

    try:
        task_offsets(host.path("sys/kernel/btf/vmlinux"))
    except BTFError as exc:
        return Check("kernel-btf", "fail", f"{exc} (kernel built without "
                     "CONFIG_DEBUG_INFO_BTF)", envfixes.KERNEL_WITH_BTF)
    return Check("kernel-btf", "ok", "/sys/kernel/btf/vmlinux describes task_struct")


def check_headers(host: Host) -> Check:
    build = host.path(f"lib/modules/{host.kernel}/build")
    if not build.joinpath("include").is_dir():
        return Check("kernel-headers", "fail", f"no kernel headers at /lib/modules/{host.kernel}"
                     "/build (bcc compiles the probes against them)", envfixes.KERNEL_HEADERS)
    try:
        text = build.joinpath("include/generated/utsrelease.h").read_text()
        release = re.search(r'"(.*)"', text).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):               # AttributeError: no match
        release = "unknown"
    if release != host.kernel:
        return Check("kernel-headers", "warn", f"headers are for {release}, the kernel is "
                     f"{host.kernel}: enough for gpuwhy's tracepoint-only programs",
                     envfixes.KERNEL_HEADERS)
    return Check("kernel-headers", "ok", f"/lib/modules/{host.kernel}/build")


def check_bcc() -> Check:
    try:
        import bcc  # noqa: F401 - only whether it imports
    except ImportError as exc:
        return Check("bcc", "fail", f"{exc} in {sys.executable} (bcc comes from the "
                     "distribution: the venv needs --system-site-packages)", envfixes.BCC)
    return Check("bcc", "ok", f"importable from {sys.executable}")


def check_tracefs(host: Host) -> Check:
    for path in ("sys/kernel/tracing/events", "sys/kernel/debug/tracing/events"):
        if host.path(path).is_dir():
            return Check("tracefs", "ok", f"/{path.removesuffix('/events')}")
    return Check("tracefs", "fail", "tracefs is not mounted (the probes attach to "
                 "tracepoints)", envfixes.TRACEFS)


def check_bpf(host: Host, held: set[str] | None = None) -> Check:
    if not host.path("proc/sys/kernel/unprivileged_bpf_disabled").exists():
        return Check("bpf", "fail", "the kernel has no bpf() system call "
                     "(CONFIG_BPF_SYSCALL)", envfixes.KERNEL_WITH_BTF)
    held = effective_capabilities() if held is None else held
    if not can_load_bpf(held):
        return Check("bpf", "fail", "this process lacks CAP_BPF and CAP_PERFMON (not root)",
                     envfixes.BPF_CAPABILITIES)
    missing = sorted(set(PROBE_CAPABILITIES) - held)
    notes = []
    if _version_tuple(host.kernel)[:2] < MEMLOCK_ACCOUNTING_KERNEL and \
            "CAP_SYS_RESOURCE" not in held:
        # before 5.11 BPF maps count against RLIMIT_MEMLOCK: the units lift it
        # (LimitMEMLOCK=infinity); a shell or container that does not needs the capability
        notes.append(f"kernel {host.kernel} charges BPF maps to RLIMIT_MEMLOCK (before "
                     "5.11): run the probes with LimitMEMLOCK=infinity (the unit does) or "
                     "CAP_SYS_RESOURCE")
    try:
        lockdown = host.path("sys/kernel/security/lockdown").read_text()
    except OSError:
        lockdown = ""
    if "[confidentiality]" in lockdown:
        return Check("bpf", "fail", "kernel lockdown=confidentiality forbids reading kernel "
                     "memory from BPF", envfixes.same_everywhere(
                         "boot with lockdown=integrity on the kernel command line"))
    if missing:
        return Check("bpf", "warn", f"missing {', '.join(missing)}: "
                     + "; ".join(PROBE_CAPABILITIES[m] for m in missing), envfixes.BPF_CAPABILITIES)
    return Check("bpf", "ok", "bpf() available; holds " + ", ".join(
        sorted(held & set(PROBE_CAPABILITIES))) + ("; " + "; ".join(notes) if notes else ""))


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("python", "fail", f"{sys.executable} is Python {version}; gpuwhy needs "
                     f"{'.'.join(map(str, MIN_PYTHON))}+", envfixes.PYTHON)
    return Check("python", "ok", f"{version} ({sys.executable})")


def check_disk(host: Host) -> Check:
    store = host.config["store.path"]
    directory = host.path(os.path.dirname(os.path.abspath(store)))
    while not directory.exists():
        directory = directory.parent
    usage = shutil.disk_usage(directory)
    detail = f"{usage.free / 2**30:.1f} GiB free at {directory} (store {store})"
    fix = envfixes.same_everywhere(f"free space on the filesystem of {directory}, or set "
                                   "store.path (GPUWHY_DB) to a larger one")
    if usage.free < DISK_FAIL_BYTES:
        return Check("disk", "fail", detail, fix)
    if usage.free < DISK_WARN_BYTES:
        return Check("disk", "warn", detail, fix)
    return Check("disk", "ok", detail)


def run_checks(host: Host) -> list[Check]:
    driver_check, driver = check_driver(host)
    return [driver_check, check_dcgm(host, driver), check_nvml(host, driver), check_btf(host),
            check_headers(host), check_bcc(), check_tracefs(host), check_bpf(host),
            check_python(), check_disk(host)]


def report(host: Host, checks: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.state != "fail" for c in checks),
            "host": {"distro": host.distro.pretty, "family": host.distro.family or "unknown",
                     "kernel": host.kernel, "machine": host.machine},
            "checks": [asdict(c) for c in checks]}


def render(result: dict[str, Any]) -> str:
    """The human-readable report: one line per check, the fixes under each failure."""
    host = result["host"]
    lines = [f"gpuwhy check-env: {host['distro']} ({host['family']}), kernel {host['kernel']}"]
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    for check in result["checks"]:
        lines.append(f"  {marks[check['state']]}  {check['name']:<15} {check['detail']}")
        for family in envfixes.FAMILIES:
            if family in check["fix"]:
                mine = " (this host)" if family == host["family"] else ""
                lines.append(f"          fix, {family}{mine}: {check['fix'][family]}")
    verdict = "ready" if result["ok"] else "NOT ready: fix the FAIL lines above"
    lines.append(f"gpuwhy check-env: {verdict}")
    return "\n".join(lines)
