"""The systemd units: they verify, grant the probes and the stack sampler exactly their
capabilities, and harden."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.caps import PROBE_CAPABILITIES
from gpuwhy.probes.klog.source import KMSG_FD_NAME

REPO = Path(__file__).resolve().parent.parent
UNITS = ("gpuwhy.service", "gpuwhy-probes.service", "gpuwhy-stacks.service")
SOCKET = "gpuwhy-kmsg.socket"
GPUWHY = Path(sys.executable).parent / "gpuwhy"


def _settings(unit: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (REPO / "systemd" / unit).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


@pytest.fixture
def unit_dir(tmp_path):
    """The repository's units with ExecStart pointing at this venv's gpuwhy, as
    scripts/install.sh rewrites them (verify checks that the command exists)."""
    for unit in (*UNITS, SOCKET):
        text = (REPO / "systemd" / unit).read_text()
        (tmp_path / unit).write_text(text.replace("/opt/gpuwhy/venv/bin/gpuwhy", str(GPUWHY)))
    return tmp_path


def _verify(directory: Path, *units: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", *units], cwd=directory,
                          capture_output=True, text=True, timeout=60)


def test_units_verify_without_a_warning(unit_dir):
    result = _verify(unit_dir, *UNITS, SOCKET)
    # systemd-analyze exits 0 on unknown keys and bad values: stderr must be empty too
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_verify_check_catches_a_bad_key(unit_dir):
    unit = unit_dir / "gpuwhy.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=30s", "WatchdogSecs=30s"))
    result = _verify(unit_dir, *UNITS)
    assert "Unknown key 'WatchdogSecs'" in result.stderr


def test_probes_get_exactly_their_capabilities():
    probes = _settings("gpuwhy-probes.service")
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert probes[key] == [" ".join(PROBE_CAPABILITIES)], key
    assert probes["User"] == ["gpuwhy-probes"] and probes["SupplementaryGroups"] == ["gpuwhy"]
    assert probes["NoNewPrivileges"] == ["yes"]
    assert "ProtectKernelModules" not in probes    # it would hide the headers bcc needs
    # LimitMEMLOCK=infinity does what CAP_SYS_RESOURCE was held for (#54)
    assert "CAP_SYS_RESOURCE" not in PROBE_CAPABILITIES and probes["LimitMEMLOCK"] == ["infinity"]
    # CAP_SYS_PTRACE is for reading other users' /proc files, never for reaching into them
    denied = {call for line in probes["SystemCallFilter"] if line.startswith("~")
              for call in line[1:].split()}
    assert {"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
            "kcmp"} <= denied



def test_the_stack_sampler_reads_memory_and_nothing_more():
    """gpuwhy-stacks.service (decision 0018): CAP_SYS_PTRACE alone, process_vm_readv allowed
    (py-spy reads with it) and every other way into a process denied; the same sampler
    source as `gpuwhy up` runs, alone, on the bus and targets file of gpuwhy.service."""
    stacks = _settings("gpuwhy-stacks.service")
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert stacks[key] == ["CAP_SYS_PTRACE"], key
    assert stacks["ExecStart"][0].endswith(" probes --only stacks")
    assert stacks["DynamicUser"] == ["yes"] and stacks["SupplementaryGroups"] == ["gpuwhy"]
    assert "User" not in stacks       # not the probes' user: no uid shared with CAP_BPF
    allowed = {call for line in stacks["SystemCallFilter"] if not line.startswith("~")
               for call in line.split()}
    denied = {call for line in stacks["SystemCallFilter"] if line.startswith("~")
              for call in line[1:].split()}
    assert allowed == {"@system-service"} and "process_vm_readv" not in denied
    assert {"ptrace", "process_vm_writev", "pidfd_getfd", "kcmp"} <= denied
    listed = subprocess.run(["systemd-analyze", "syscall-filter", "@ipc"],
                            capture_output=True, text=True, timeout=60).stdout.split()
    assert "process_vm_readv" in listed          # @system-service holds @ipc, which holds it
    for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("NoNewPrivileges", "yes"),
                       ("PrivateNetwork", "yes"), ("RestrictAddressFamilies", "AF_UNIX")):
        assert stacks[key] == [value], key
    # /run/gpuwhy stays read-only through ProtectSystem=strict; no path is made writable
    assert not {"ReadWritePaths", "RuntimeDirectory", "StateDirectory"} & set(stacks)
    assert stacks["After"] == ["gpuwhy.service"] and stacks["PartOf"] == ["gpuwhy.service"]
    assert "gpuwhy-stacks.service" in _settings("gpuwhy.service")["Wants"][0].split()
    install = (REPO / "scripts" / "install.sh").read_text()
    assert "gpuwhy-stacks.service" in install.split("units=(", 1)[1].split(")", 1)[0]
    assert "enable gpuwhy.service gpuwhy-probes.service gpuwhy-stacks.service" in install


def _bytes(size: str) -> int:
    return int(size[:-1]) << {"K": 10, "M": 20, "G": 30}[size[-1]]


# What the units' comments say was measured (MB resident, at rest and at the peak) must fit
# under MemoryHigh=, itself under MemoryMax= (#54: memory bounded, and budgeted).
@pytest.mark.parametrize(("unit", "measured_peak_mb"), [("gpuwhy-probes.service", 200),
                                                       ("gpuwhy.service", 68),
                                                       ("gpuwhy-stacks.service", 28)])
def test_each_unit_has_a_memory_budget_above_what_was_measured(unit, measured_peak_mb):
    settings = _settings(unit)
    high, peak = _bytes(settings["MemoryHigh"][0]), _bytes(settings["MemoryMax"][0])
    assert measured_peak_mb << 20 < high < peak
    assert f"{measured_peak_mb}" in (REPO / "systemd" / unit).read_text()


def test_the_service_is_unprivileged_notify_with_a_watchdog():
    service = _settings("gpuwhy.service")
    assert service["Type"] == ["notify"] and service["User"] == ["gpuwhy"]
    assert service["SupplementaryGroups"] == ["systemd-journal"]
    assert service["CapabilityBoundingSet"] == [""] and service["AmbientCapabilities"] == [""]
    assert re.fullmatch(r"\d+s", service["WatchdogSec"][0])
    assert service["Restart"] == ["on-failure"]
    for key, value in (("ProtectSystem", "strict"), ("StateDirectory", "gpuwhy"),
                       ("RuntimeDirectory", "gpuwhy"), ("PrivateTmp", "yes"),
                       ("NoNewPrivileges", "yes"), ("ProtectHome", "yes")):
        assert service[key] == [value], key
    # the probes' user reaches the bus socket through the group, nobody else does
    assert service["RuntimeDirectoryMode"] == ["0750"] and service["UMask"] == ["0007"]
    assert service["ExecStart"][0].endswith(" serve")


def test_the_service_gets_dev_kmsg_from_systemd_under_the_name_the_source_takes():
    socket = _settings(SOCKET)
    assert socket["ListenSpecial"] == ["/dev/kmsg"]
    assert socket["FileDescriptorName"] == [KMSG_FD_NAME]
    assert socket.get("Writable", ["no"]) == ["no"]        # read-only: a wake-up, no more
    # stopped with the service: a kernel line must not start a gpuwhy stopped on purpose
    assert socket["PartOf"] == ["gpuwhy.service"] and socket["Service"] == ["gpuwhy.service"]
    service = _settings("gpuwhy.service")
    assert service["Sockets"] == [SOCKET] and SOCKET in service["Wants"][0].split()
    assert SOCKET in service["After"][0].split()
    assert service["ProtectKernelLogs"] == ["yes"]     # the service still cannot open it


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure_stays_low(unit_dir, unit):
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                             str(unit_dir / unit)], capture_output=True, text=True, timeout=60)
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)[1])
    assert score <= 2.5, result.stdout     # 1.7, 1.9 and 1.2 when written; "OK" ends at 3.9


def test_sysusers_creates_both_users_and_their_groups(tmp_path):
    (tmp_path / "etc").mkdir()
    result = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", "--dry-run",
                             str(REPO / "systemd" / "gpuwhy.sysusers")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for line in ("Creating user 'gpuwhy' ", "Creating user 'gpuwhy-probes' ",
                 "Creating group 'gpuwhy' ", "Creating group 'gpuwhy-probes' "):
        assert line in result.stdout + result.stderr
    text = (REPO / "systemd" / "gpuwhy.sysusers").read_text()
    assert "m gpuwhy        systemd-journal" in text and "m gpuwhy-probes gpuwhy" in text
