"""gpuwhy's parsing and reading code run over the real-GPU recordings in tests/data/real/*/,
each compared with the recording's own ground truth (nvidia-smi, pynvml, the driver's files).

Every folder with a ``summary.json`` is one run of scripts/gpu-kit.sh on a GPU host
(tests/data/real/README.md). Nothing here names a UUID, bus id or measured number of one
recording: the expected values come from the recording's ``host/`` and ``nvml/`` files, the
phases from ``work/phases.jsonl``; what is asserted beyond them is physics (a bf16 matmul keeps
the SMs and tensor pipes busy, a pinned host-to-device copy fills PCIe and no SM).
"""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pynvml
import pytest

from gpuwhy.app.deploy.checkenv import Host, check_bpf, check_driver, check_tracefs
from gpuwhy.app.deploy.envfixes import Distro
from gpuwhy.app.proc_cli import process_report
from gpuwhy.caps import effective_capabilities
from gpuwhy.correlator.incidents import may_open_incident
from gpuwhy.gpu_health import throttling
from gpuwhy.gpufields import THROTTLE_BITS
from gpuwhy.identity import classify_device
from gpuwhy.probes.gpu import nvml as nvml_module
from gpuwhy.probes.gpu.nvml import MIB, memory_info
from gpuwhy.probes.gpu.source import minor_from_procfs, normalise_bus_id, proc_identities
from gpuwhy.probes.klog.parse import UNPARSED
from gpuwhy.proc import parse_cgroup
from gpuwhy.rules.vocabulary import gpu_model

from .realdata import kernel_records

REAL = Path(__file__).parent / "data" / "real"
RECORDINGS = sorted(p for p in REAL.iterdir() if (p / "summary.json").is_file()) \
    if REAL.is_dir() else []
PHASE_FILES = ("idle", "matmul", "h2d-pageable", "h2d-pinned", "after")

# nvidia-smi -q -x's clock-event reason elements -> gpuwhy's bit names (gpufields.THROTTLE_BITS)
SMI_REASONS = {"gpu_idle": "IDLE", "applications_clocks_setting": "APP_CLOCKS",
               "sw_power_cap": "SW_POWER_CAP", "hw_slowdown": "HW_SLOWDOWN",
               "sync_boost": "SYNC_BOOST", "sw_thermal_slowdown": "SW_THERMAL",
               "hw_thermal_slowdown": "HW_THERMAL", "hw_power_brake_slowdown": "HW_POWER_BRAKE"}

# PCIe per lane: transfer rate (GT/s) and line-code efficiency, by generation (PCI-SIG).
PCIE_LANE = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
             5: (32.0, 128 / 130)}


def _mib(text: str) -> float:
    """``"143771 MiB"`` -> 143771.0"""
    return float(text.split()[0])


@dataclass
class Recording:
    path: Path

    @cached_property
    def summary(self) -> dict:
        return json.loads((self.path / "summary.json").read_text())

    @cached_property
    def smi(self) -> list[ET.Element]:
        """The ``<gpu>`` elements of nvidia-smi -q -x."""
        return ET.parse(self.path / "host" / "nvidia-smi-q.xml").getroot().findall("gpu")

    @cached_property
    def smi_root(self) -> ET.Element:
        return ET.parse(self.path / "host" / "nvidia-smi-q.xml").getroot()

    def smi_gpu(self, uuid: str) -> ET.Element:
        return next(g for g in self.smi if g.findtext("uuid") == uuid)

    @cached_property
    def phases(self) -> dict[str, dict]:
        lines = (self.path / "work" / "phases.jsonl").read_text().splitlines()
        return {p["phase"]: p for p in map(json.loads, filter(None, lines))}

    def lines(self, phase_file: str) -> list[dict]:
        path = self.path / "gpuwhy" / f"sample-{phase_file}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def samples(self, phase_file: str) -> list[dict]:
        """The whole-GPU ``gpu_sample`` lines of one sample file (MIG instances left out)."""
        return [s for s in self.lines(phase_file)
                if "kind" not in s and not s.get("instance")]

    def in_phase(self, phase: str, kind: str = "sample") -> list[dict]:
        """The sample (or ``gpu_processes``) lines of ``sample-PHASE.jsonl`` taken inside the
        phase's measured window, by realtime ns."""
        window = self.phases[phase]
        lines = (self.samples(phase) if kind == "sample" else
                 [x for x in self.lines(phase) if x.get("kind") == "gpu_processes"])
        return [x for x in lines if window["start_ns"] <= x["ts"] <= window["end_ns"]]

    @cached_property
    def nvml(self) -> dict:
        return json.loads((self.path / "nvml" / "processes.json").read_text())

    @cached_property
    def proc_scan(self) -> dict:
        return json.loads((self.path / "gpuwhy" / "proc-scan.json").read_text())

    @cached_property
    def check_env(self) -> dict:
        return {c["name"]: c for c in
                json.loads((self.path / "gpuwhy" / "check-env.json").read_text())["checks"]}


@pytest.fixture(params=RECORDINGS, ids=[p.name for p in RECORDINGS])
def rec(request) -> Recording:
    recording = Recording(request.param)
    if not recording.summary["gpu"]["present"]:
        pytest.skip(f"{recording.path.name}: recorded without a GPU")
    return recording


def median(values) -> float:
    values = [v for v in values if v is not None]
    assert values, "no values"
    return statistics.median(values)


def field(samples: list[dict], name: str) -> list[float]:
    return [s["fields"][name] for s in samples if s["fields"].get(name) is not None]


# --- 1. GPU identity ------------------------------------------------------------------------

def test_procfs_identity_is_nvidia_smis(rec):
    """The driver's /proc files, read by gpuwhy (proc_identities, minor_from_procfs), give
    each GPU the UUID, bus id and minor that nvidia-smi gives it."""
    proc_root = str(rec.path / "host" / "proc")
    smi = {(g.findtext("uuid"), normalise_bus_id(g.findtext("pci/pci_bus_id")),
            int(g.findtext("minor_number"))) for g in rec.smi}
    assert smi
    read = {(i.uuid, normalise_bus_id(i.pci_bus_id), i.minor) for i in proc_identities(proc_root)}
    assert read == smi
    for _uuid, bus, minor in smi:
        assert minor_from_procfs(bus, proc_root) == minor


def test_nvml_samples_name_the_gpu_nvidia_smi_names(rec):
    """Every NVML sample gpuwhy took names a GPU by nvidia-smi's UUID, model and bus id, and
    its static fields are nvidia-smi's: memory size, PCIe link maxima, power limit."""
    for phase in PHASE_FILES:
        samples = rec.samples(phase)
        assert samples, phase
        for s in samples:
            gpu = rec.smi_gpu(s["uuid"])
            assert s["gpu_id"] == s["uuid"]
            assert s["source"] == "nvml" and s["simulated"] is False
            assert s["model"] == gpu.findtext("product_name")
            assert s["pci_bus_id"] == normalise_bus_id(gpu.findtext("pci/pci_bus_id"))
            f = s["fields"]
            assert f["fb_total_mib"] == _mib(gpu.findtext("fb_memory_usage/total"))
            links = gpu.find("pci/pci_gpu_link_info")
            assert f["pcie_link_gen_max"] == int(links.findtext("pcie_gen/max_link_gen"))
            assert f["pcie_link_width_max"] == \
                int(links.findtext("link_widths/max_link_width").rstrip("x"))
            assert f["power_limit_w"] == pytest.approx(
                float(gpu.findtext("gpu_power_readings/current_power_limit").split()[0]))
            # a counter since the driver loaded: never below nvidia-smi's earlier reading
            assert f["pcie_replays"] >= int(gpu.findtext("pci/replay_counter"))
    nvml = {g["uuid"]: g for g in rec.nvml["gpus"]}
    for uuid, g in nvml.items():
        smi = rec.smi_gpu(uuid)
        assert g["name"] == smi.findtext("product_name")
        assert normalise_bus_id(g["pci_bus_id"]) == normalise_bus_id(smi.findtext("pci/pci_bus_id"))
        assert g["minor"] == int(smi.findtext("minor_number"))


def test_check_env_names_the_driver_and_gpus_nvidia_smi_names(rec):
    """check-env's driver and NVML verdicts, and the same checks run again by gpuwhy over the
    recorded driver files, agree with nvidia-smi."""
    checks = rec.check_env
    driver = rec.smi_root.findtext("driver_version")
    assert checks["nvidia-driver"]["state"] == "ok"
    assert checks["nvml"]["state"] == "ok"
    assert checks["nvml"]["detail"].startswith(f"{len(rec.smi)} GPU(s): ")
    for gpu in rec.smi:
        assert f"{gpu.findtext('product_name')} ({gpu.findtext('uuid')})" in \
            checks["nvml"]["detail"]
    assert checks["nvidia-driver"]["detail"].startswith(f"{driver};")


def _fake_root(rec: Recording, tmp_path: Path) -> Path:
    """A host root with the recording's driver files and /dev/nvidia* names."""
    root = tmp_path / "root"
    (root / "proc" / "driver").mkdir(parents=True)
    os.symlink(rec.path / "host" / "proc" / "driver" / "nvidia",
               root / "proc" / "driver" / "nvidia")
    (root / "dev").mkdir()
    for path in dev_nodes(rec):
        if path.count("/") == 2:            # /dev/NAME; the caps live in a folder
            (root / path.lstrip("/")).touch()
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    bpf = json.loads((rec.path / "host" / "bpf.json").read_text())
    (root / "proc" / "sys" / "kernel" / "unprivileged_bpf_disabled").write_text(
        bpf["unprivileged_bpf_disabled"] + "\n")
    return root


def test_check_env_replayed_on_the_recorded_files(rec, tmp_path):
    """gpuwhy's driver, tracefs and bpf checks, run again over the recorded /proc, /dev and
    capability mask, give the verdicts check-env gave on the host."""
    bpf = json.loads((rec.path / "host" / "bpf.json").read_text())
    env = json.loads((rec.path / "env.json").read_text())
    host = Host(root=_fake_root(rec, tmp_path), config={}, distro=Distro("", "", ""),
                machine=env["machine"], kernel=rec.summary["kernel"])
    checks = rec.check_env
    assert check_driver(host)[0].detail == checks["nvidia-driver"]["detail"]
    assert check_driver(host)[1] == rec.smi_root.findtext("driver_version")
    if not bpf["tracefs_events"]:
        assert check_tracefs(host).state == checks["tracefs"]["state"] == "fail"
    status = tmp_path / "status"
    status.write_text(f"CapEff:\t{bpf['this_process']['capabilities']['cap_eff']}\n")
    replayed = check_bpf(host, effective_capabilities(status))
    # recorded while gpuwhy still asked for CAP_SYS_RESOURCE, which this kernel (>= 5.11)
    # never needed: the note that said so is gone with the ask
    recorded = checks["bpf"]["detail"].replace(
        "; CAP_SYS_RESOURCE is not held, not needed on this kernel (BPF memory is charged to "
        "the cgroup since 5.11)", "")
    assert (replayed.state, replayed.detail) == (checks["bpf"]["state"], recorded)
    assert bpf["this_process"]["prog_load_tracepoint"]["ok"] is (checks["bpf"]["state"] == "ok")


def test_model_facts_are_nvidia_smis(rec):
    """The nominal facts gpuwhy's rules take from the model name (vocabulary.GPU_MODELS) are
    what nvidia-smi reports: maximum SM clock, default power limit, PCIe generation."""
    for gpu in rec.smi:
        model = gpu_model(gpu.findtext("product_name"))
        assert model is not None, gpu.findtext("product_name")
        assert model.clk_sm_max == _mib(gpu.findtext("max_clocks/sm_clock"))
        assert model.plim_default_w == pytest.approx(
            float(gpu.findtext("gpu_power_readings/default_power_limit").split()[0]))
        assert model.pcie_gen == int(gpu.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen"))


# --- memory: gpuwhy's used framebuffer is nvidia-smi's ------------------------------------

class _MemoryNvml:
    """Stands for pynvml with an idle GPU's memory as nvidia-smi reported it: the v2 struct
    (reserve apart) and the v1 struct (used = total - free, the reserve in it)."""

    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_ArgumentVersionMismatch = pynvml.NVMLError_ArgumentVersionMismatch
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpu: ET.Element, has_v2: bool = True):
        self.total, self.used, self.free, self.reserved = (
            int(_mib(gpu.findtext(f"fb_memory_usage/{k}"))) * MIB
            for k in ("total", "used", "free", "reserved"))
        self.has_v2 = has_v2

    def __getattr__(self, name):    # the rest of the binding, not called here
        return getattr(pynvml, name)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):  # noqa: N802 - pynvml's name
        if version is None:
            return pynvml.c_nvmlMemory_t(self.total, self.free, self.total - self.free)
        if not self.has_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert version == pynvml.nvmlMemory_v2
        return pynvml.c_nvmlMemory_v2_t(version, self.total, self.reserved, self.free, self.used)


def test_nvml_used_memory_is_nvidia_smis(rec):
    """gpuwhy's NVML reading of used memory is nvidia-smi's (and DCGM's field 252): the
    driver's reserve (616 MiB on the H200 of 2026-12-04) is not used memory. Before the v2
    struct was read, an idle GPU with no process read that reserve as used."""
    for gpu in rec.smi:
        nv = _MemoryNvml(gpu)
        assert memory_info(nv, "handle").used / MIB == _mib(gpu.findtext("fb_memory_usage/used"))
        assert memory_info(nv, "handle").total / MIB == \
            _mib(gpu.findtext("fb_memory_usage/total"))
        readers = nvml_module._readers(nv)     # what NvmlSource reads fb_* with
        assert readers["fb_used_mib"]("handle") == _mib(gpu.findtext("fb_memory_usage/used"))
        assert readers["fb_total_mib"]("handle") == _mib(gpu.findtext("fb_memory_usage/total"))
        old = _MemoryNvml(gpu, has_v2=False)    # a driver before 510: v1, all it has
        assert memory_info(old, "handle").used == old.total - old.free


def test_recorded_idle_memory_is_nvidia_smis_used(rec):
    """An idle GPU's used memory is nvidia-smi's (0 MiB on the H200), not used + the
    driver's reserve (616 MiB there), which the v1 struct gave before the fix."""
    for s in rec.samples("idle"):
        gpu = rec.smi_gpu(s["uuid"])
        used = _mib(gpu.findtext("fb_memory_usage/used"))
        assert abs(s["fields"]["fb_used_mib"] - used) <= 1


# --- 2. the NVML samples by phase ----------------------------------------------------------

def test_each_load_phase_has_samples_with_gpm(rec):
    for phase in ("matmul", "h2d-pageable", "h2d-pinned"):
        samples = rec.in_phase(phase)
        assert len(samples) >= 5, phase
        assert len(field(samples, "sm_active")) >= 4, phase   # GPM from the second read on


def test_matmul_keeps_sms_and_tensor_cores_busy(rec):
    """During the bf16 matmul: utilisation near 100 %, most SMs and the tensor pipes active,
    the engine busy; little PCIe traffic. GPM's values are pynvml's own reading ÷ 100."""
    samples = rec.in_phase("matmul")
    assert median(field(samples, "gpu_util")) >= 90
    assert median(field(samples, "sm_active")) >= 0.8
    assert median(field(samples, "tensor_active")) >= 0.5
    assert median(field(samples, "gr_engine_active")) >= 0.9
    peak = link_bytes_per_s(samples[0]["fields"])
    assert median(field(samples, "pcie_rx_bytes_per_s")) < 0.01 * peak
    for g in rec.nvml["gpus"]:
        gpm = g.get("gpm") or {}
        if not gpm.get("supported"):
            continue
        ours = [s for s in samples if s["uuid"] == g["uuid"]]
        for name, metric in (("sm_active", "SM_UTIL"), ("tensor_active", "ANY_TENSOR_UTIL"),
                             ("gr_engine_active", "GRAPHICS_UTIL"),
                             ("dram_active", "DRAM_BW_UTIL")):
            # pynvml read over its own 1 s interval of the same phase: a few points apart
            assert median(field(ours, name)) == pytest.approx(gpm["metrics"][metric] / 100,
                                                              abs=0.05), name


def link_bytes_per_s(fields: dict) -> float:
    """The link's raw rate per direction at its current generation and width."""
    gts, code = PCIE_LANE[int(fields["pcie_link_gen"])]
    return gts * 1e9 * code / 8 * fields["pcie_link_width"]


# NVML's PCIe counter counts every byte on the link, TLP headers included, so it reads above
# the payload rate the copy measured: 1.10 for the H200's pinned copies (61.0 GB/s counted,
# 55.36 GB/s moved). With PCIe's 24-byte TLP overhead (header, sequence number, LCRC,
# framing) that is 128 B ~ 1.19 and 256 B ~ 1.09 of payload; the lower end allows for the
# measured rate averaging a little idle time between copies in.
PCIE_OVERHEAD = (0.95, 1.3)


def test_pinned_copies_fill_pcie_and_no_sm(rec):
    """Pinned host-to-device copies: PCIe receive carries the measured rate plus protocol
    overhead, within the link's raw rate; SMs, tensor pipes and the engine idle. And NVML's
    utilisation reads ~100 %: copy-engine work counts as "utilisation" (a real NVML fact,
    per process too), so gpu_util alone does not say kernels ran."""
    samples = rec.in_phase("h2d-pinned")
    rate = rec.phases["h2d-pinned"]["rate"] * 1e9     # GB/s measured by the load
    rx = median(field(samples, "pcie_rx_bytes_per_s"))
    assert PCIE_OVERHEAD[0] <= rx / rate <= PCIE_OVERHEAD[1]
    # NVML's "KB/s" times 1024 (docs/gpu-fields.md): within the link, with 2.4 % of slack
    # for a KB of 1000
    assert rx <= 1.03 * link_bytes_per_s(samples[0]["fields"])
    assert rx >= 5 * median(field(samples, "pcie_tx_bytes_per_s"))  # read requests go back
    assert median(field(samples, "sm_active")) <= 0.01
    assert median(field(samples, "tensor_active")) <= 0.01
    assert median(field(samples, "gr_engine_active")) <= 0.01
    assert median(field(samples, "gpu_util")) >= 90
    pid = json.loads((rec.path / "work" / "work.json").read_text())["pid"]
    sm_util = [p["sm_util"] for line in rec.in_phase("h2d-pinned", "processes")
               for p in line["processes"] if p["pid"] == pid]
    assert median(sm_util) >= 90


def test_pageable_copies_are_slower_than_pinned(rec):
    """Pageable copies are staged by the CPU: a lower measured rate, less PCIe traffic, a
    copy engine busy part of the time (lower utilisation), still no SM."""
    pageable, pinned = rec.in_phase("h2d-pageable"), rec.in_phase("h2d-pinned")
    assert rec.phases["h2d-pageable"]["rate"] < rec.phases["h2d-pinned"]["rate"]
    assert median(field(pageable, "pcie_rx_bytes_per_s")) < \
        median(field(pinned, "pcie_rx_bytes_per_s"))
    rx = median(field(pageable, "pcie_rx_bytes_per_s"))
    assert PCIE_OVERHEAD[0] <= rx / (rec.phases["h2d-pageable"]["rate"] * 1e9) <= PCIE_OVERHEAD[1]
    assert median(field(pageable, "gpu_util")) < median(field(pinned, "gpu_util"))
    assert median(field(pageable, "sm_active")) <= 0.01


def _smi_reasons(gpu: ET.Element) -> int:
    mask = 0
    for element in gpu.find("clocks_event_reasons"):
        name = element.tag.removeprefix("clocks_event_reason_")
        if element.text.strip() == "Active":
            mask |= THROTTLE_BITS[SMI_REASONS[name]]
    return mask


def test_clock_event_reasons(rec):
    """The clock-event reasons, decoded with gpuwhy's bits: the idle GPU's are nvidia-smi's
    (taken idle, at the start); a busy GPU never reads idle; a board at its power limit
    reads the software power cap; and none of it is throttling to gpuwhy's health."""
    idle, busy = THROTTLE_BITS["IDLE"], THROTTLE_BITS["SW_POWER_CAP"]
    for gpu in rec.smi:
        masks = [int(s["fields"]["clocks_event_reasons"]) for s in rec.samples("idle")
                 if s["uuid"] == gpu.findtext("uuid")]
        assert statistics.mode(masks) == _smi_reasons(gpu)
        assert statistics.mode(masks) & idle
    for phase in ("matmul", "h2d-pinned"):
        for s in rec.in_phase(phase):
            assert not int(s["fields"]["clocks_event_reasons"]) & idle, phase
    for s in rec.in_phase("matmul"):
        if s["fields"]["power_w"] >= 0.95 * s["fields"]["power_limit_w"]:
            assert int(s["fields"]["clocks_event_reasons"]) & busy
    for phase in PHASE_FILES:
        for s in rec.samples(phase):
            if int(s["fields"]["clocks_event_reasons"]) & busy:   # only near the limit
                assert s["fields"]["power_w"] >= 0.9 * s["fields"]["power_limit_w"]
            assert throttling(s["fields"]) == 0


def test_process_memory_is_pynvmls_and_nvidia_smis(rec):
    """gpuwhy's gpu_processes lines, taken in the phase pynvml and nvidia-smi read in, give
    the load process the memory pynvml gives it (to the byte) and nvidia-smi shows (MiB);
    their start time is the process key gpuwhy's /proc scan found."""
    pid = json.loads((rec.path / "work" / "work.json").read_text())["pid"]
    gpus = [g for g in rec.nvml["gpus"] if any(p["pid"] == pid for p in g["compute_processes"])]
    assert len(gpus) == 1       # the load drives one GPU
    for g in gpus:
        expected = next(p["used_memory"] for p in g["compute_processes"] if p["pid"] == pid) / MIB
        read_at = {u["ts"] for u in g.get("process_utilization", []) if u["pid"] == pid}
        phase = next(name for name, p in rec.phases.items()
                     if any(p["start_ns"] <= ts * 1000 <= p["end_ns"] for ts in read_at))
        lines = [x for x in rec.in_phase(phase, "processes") if x["gpu_id"] == g["uuid"]]
        rows = [p for x in lines for p in x["processes"] if p["pid"] == pid]
        assert rows
        assert {p["used_memory_mib"] for p in rows} == {expected}
        assert {p["start_time"] for p in rows} == {rec.proc_scan["start_time"]}
        u = next(u for u in g["process_utilization"] if u["pid"] == pid)
        assert median(p["sm_util"] for p in rows) == pytest.approx(u["sm"], abs=10)
    with open(rec.path / "nvml" / "nvidia-smi-apps.csv") as f:
        apps = {int(r["pid"]): r for r in csv.DictReader(f, skipinitialspace=True)}
    assert _mib(apps[pid]["used_gpu_memory [MiB]"]) == expected
    lines = (rec.path / "nvml" / "nvidia-smi-pmon.txt").read_text().splitlines()
    columns = lines[0].lstrip("#").split()            # gpu pid type sm mem ... fb ... command
    rows = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    assert [float(r[columns.index("fb")]) for r in rows
            if r[columns.index("pid")] == str(pid)] == [expected]


# --- 3. the kernel log ---------------------------------------------------------------------

def test_kernel_log_lines_parse_and_open_nothing_they_should_not(rec):
    """Every recorded NVRM line goes through gpuwhy's kernel-log parser without an unparsed
    record; as many Xid records come out as the text has Xid lines (none on a healthy boot),
    and only those may open an incident. A driver-load line gives nvidia-smi's version."""
    text = (rec.path / "host" / "kernel-log-nvidia.txt").read_text().splitlines()
    records = kernel_records(rec.path / "host" / "kernel-log-nvidia.txt")
    assert [r for r in records if r.record_kind == UNPARSED] == []
    xid_lines = [line for line in text if re.search(r"\bXid \(", line)]
    xids = [r for r in records if r.record_kind == "xid"]
    assert len(xids) == len(xid_lines)
    fallen = [r for r in records if r.record_kind == "fallen_off_bus"]
    assert bool(fallen) == any("fallen off the bus" in line for line in text)
    assert {id(r) for r in records if may_open_incident(r)} == {id(r) for r in xids + fallen}
    assert not [r for r in records if r.record_kind == "rm_init_failed"] or \
        any("RmInitAdapter failed" in line or "rm_init_adapter failed" in line for line in text)
    driver = rec.smi_root.findtext("driver_version")
    flavour = "open" if "Open Kernel Module" in \
        (rec.path / "host" / "proc" / "driver" / "nvidia" / "version").read_text() \
        else "proprietary"
    loaded = [r for r in records if r.record_kind == "driver_loaded"]
    assert len(loaded) == len([line for line in text if "NVRM: loading NVIDIA UNIX" in line])
    for r in loaded:
        assert (r.driver_version, r.details["flavour"]) == (driver, flavour)


# --- 4. /dev/nvidia* and /proc/devices -------------------------------------------------------

_LS = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(?P<major>\d+),\s+(?P<minor>\d+)\s+.*?(?P<name>\S+)$")


def dev_nodes(rec: Recording) -> dict[str, tuple[int, int]]:
    """``ls -l /dev/nvidia*`` of host/dev-nvidia.txt: path -> (major, minor)."""
    nodes, folder = {}, None
    for line in (rec.path / "host" / "dev-nvidia.txt").read_text().splitlines():
        if line.endswith(":") and line.startswith("/dev/"):
            folder = line[:-1]
        elif match := _LS.match(line):
            name = match["name"]
            path = name if name.startswith("/") else f"{folder}/{name}"
            nodes[path] = (int(match["major"]), int(match["minor"]))
    return nodes


def proc_devices(rec: Recording) -> dict[str, int]:
    """``/proc/devices`` of host/dev-nvidia.txt: driver name -> major."""
    majors = {}
    for line in (rec.path / "host" / "dev-nvidia.txt").read_text().splitlines():
        if match := re.fullmatch(r"\s*(\d+) (nvidia\S*)", line):
            majors[match[2]] = int(match[1])
    return majors


def test_device_majors_and_minors(rec):
    """The device files are the drivers' of /proc/devices (nvidia: NVIDIA's fixed major 195;
    nvidia-uvm and the caps: the dynamic majors listed there), gpuwhy classifies each by
    path, and /dev/nvidiaN's minor is the GPU's minor in the driver's /proc and nvidia-smi."""
    nodes, majors = dev_nodes(rec), proc_devices(rec)
    assert majors["nvidia"] == 195
    assert majors["nvidia-uvm"] != 195
    minors = {int(g.findtext("minor_number")) for g in rec.smi}
    by_kind: dict[str, set] = {}
    for path, (major, minor) in nodes.items():
        kind, gpu_minor = classify_device(path)
        by_kind.setdefault(kind, set()).add(major)
        if kind == "nvidiaN":
            assert gpu_minor == minor
            assert minor in minors
        if kind == "nvidiactl":
            assert minor == 255
    assert by_kind.pop("nvidiaN") == by_kind.pop("nvidiactl") == {majors["nvidia"]}
    assert by_kind.pop("nvidia-uvm") == {majors["nvidia-uvm"]}
    if "nvidia-caps" in by_kind:
        assert by_kind.pop("nvidia-caps") == {majors["nvidia-caps"]}
    assert "other" not in by_kind
    assert {classify_device(p)[1] for p in nodes if classify_device(p)[0] == "nvidiaN"} == minors


# --- 5. gpuwhy proc ------------------------------------------------------------------------

def _raw_fds(rec: Recording) -> tuple[str, dict[int, str]]:
    """proc-raw.txt: the cgroup file, then ``ls -l /proc/PID/fd``: (cgroup, fd -> target)."""
    text = (rec.path / "gpuwhy" / "proc-raw.txt").read_text()
    cgroup, _, listing = text.partition("\n\n")
    fds = {}
    for line in listing.splitlines():
        if match := re.search(r" (\d+) -> (.+)$", line):
            fds[int(match[1])] = match[2]
    return cgroup.strip(), fds


def test_proc_scan_binds_the_load_to_the_gpu(rec):
    """gpuwhy proc's report of the load process: its NVIDIA fds are the raw listing's, its
    /dev/nvidiaN minors bind it to nvidia-smi's GPU, which pynvml lists it on."""
    scan = rec.proc_scan
    work = json.loads((rec.path / "work" / "work.json").read_text())
    assert scan["pid"] == work["pid"]
    cgroup, fds = _raw_fds(rec)
    nvidia = {fd: path for fd, path in fds.items() if path.startswith("/dev/nvidia")}
    assert {f["fd"]: f["path"] for f in scan["device_fds"]} == nvidia
    for f in scan["device_fds"]:
        assert (f["kind"], f["minor"]) == classify_device(f["path"])
    bound = {g["uuid"] for g in scan["gpus"]}
    assert all(g["known_to_driver"] for g in scan["gpus"])
    on_gpu = {g["uuid"] for g in rec.nvml["gpus"]
              if any(p["pid"] == work["pid"] for p in g["compute_processes"])}
    assert bound == on_gpu
    assert scan["cgroup"] == cgroup
    owner = parse_cgroup(cgroup)
    assert (scan["container_id"], scan["pod_uid"], scan["unit"]) == \
        (owner.container_id, owner.pod_uid, owner.unit)


def test_proc_scan_replayed_over_the_raw_files(rec, tmp_path):
    """gpuwhy proc run again over a /proc made of the raw cgroup and fd listing and the
    driver's recorded files reports the same fds, GPUs and cgroup owner as on the host."""
    scan = rec.proc_scan
    cgroup, fds = _raw_fds(rec)
    proc = tmp_path / "proc"
    base = proc / str(scan["pid"])
    (base / "fd").mkdir(parents=True)
    # identity files are not in the recording: made of the report itself (not compared)
    (base / "stat").write_text(f"{scan['pid']} ({scan['comm']}) S {scan['ppid']}"
                               + " 0" * 17 + f" {scan['start_time']} 0\n")
    (base / "cmdline").write_bytes(scan["cmdline"].encode() + b"\0")
    (base / "status").write_text(f"Uid:\t{scan['uid']}\t{scan['uid']}\n")
    (base / "cgroup").write_text(cgroup + "\n")
    for fd, target in fds.items():
        os.symlink(target, base / "fd" / str(fd))
    (proc / "driver").mkdir()
    os.symlink(rec.path / "host" / "proc" / "driver" / "nvidia", proc / "driver" / "nvidia")
    report = process_report(scan["pid"], scan["device_glob"], str(proc))
    for key in ("device_fds", "gpus", "cgroup", "container_id", "pod_uid", "unit",
                "start_time"):
        assert report[key] == scan[key], key
