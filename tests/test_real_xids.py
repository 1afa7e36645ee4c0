"""Real Xids, as gpuwhy reads them: kernels that faulted on purpose on the kit's GPU host.

The real-GPU kit ends with three kernels that fault the way applications' do (an illegal
address, a trap, a PyTorch device-side assert; only their own contexts die). What the
driver said of them is in tests/data/real/<gpu>/xid/: the kernel log's NVRM lines, NVML's
Xid events as gpuwhy's own sampler printed them, the nvidia_dev_xid tracepoint's record,
and each fault's pid and times. Here gpuwhy's kernel-log parser, its GPU binding and its
rules meet them: the first answer must be an application fault, never the hardware.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuwhy.app.demo.synthetic_signals import Synthetic, run
from gpuwhy.correlator.incidents import may_open_incident
from gpuwhy.events import GpuXid
from gpuwhy.identity import normalize_pci
from gpuwhy.probes.klog.parse import UNPARSED
from gpuwhy.rules.loader import load_rules

from .realdata import kernel_records as read_kernel_log

REAL = Path(__file__).parent / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/xid/kernel-log.txt"))
KINDS = ("illegal-address", "trap", "torch-assert")
APPLICATION_XIDS = {13, 31, 43}    # NVIDIA's catalogue: the application's, not the GPU's
RULES = {rule.id: rule for rule in load_rules()}


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.name)
def folder(request) -> Path:
    return request.param


def faults(folder: Path) -> dict[str, dict]:
    return {kind: json.loads((folder / f"xid/fault-{kind}.json").read_text()) for kind in KINDS}


def kernel_records(folder: Path) -> list:
    return read_kernel_log(folder / "xid/kernel-log.txt")


def nvml_xids(folder: Path) -> list[dict]:
    """The gpu_xid lines gpuwhy's NVML sampler printed (on stderr) while the kernels ran."""
    return [json.loads(line.split(": ", 1)[1])
            for line in (folder / "xid/sample-xid.err").read_text().splitlines()
            if line.startswith("gpu_xid: ")]


def identity(folder: Path) -> tuple[str, str]:
    """The GPU's UUID and PCI bus id, as nvidia-smi gave them."""
    gpu = ET.parse(folder / "host/nvidia-smi-q.xml").getroot().find("gpu")
    return gpu.findtext("uuid"), gpu.get("id")


def test_there_is_a_recording():
    assert RECORDINGS


def test_every_kernel_faulted(folder):
    for kind, report in faults(folder).items():
        assert report["faulted"], (kind, report["error"])


def test_each_fault_is_an_xid_naming_its_process_and_gpu(folder):
    """The parser finds every Xid line, and in each the Xid, the faulting process (pid and
    name) and a PCI address that is the GPU's; each may open an incident."""
    records = kernel_records(folder)
    assert [r for r in records if r.record_kind == UNPARSED] == []
    xids = [r for r in records if r.record_kind == "xid"]
    lines = [line for line in (folder / "xid/kernel-log.txt").read_text().splitlines()
             if "NVRM: Xid (" in line]
    assert len(xids) == len(lines) >= len(KINDS)
    by_pid: dict[int, set[int]] = {}
    for record in xids:
        by_pid.setdefault(record.pid, set()).add(record.xid)
    _, bus = identity(folder)
    reports = faults(folder)
    for kind, report in reports.items():
        assert by_pid.get(report["pid"]), f"no Xid names the {kind} kernel's pid"
        assert by_pid[report["pid"]] <= APPLICATION_XIDS
    assert 31 in by_pid[reports["illegal-address"]["pid"]]      # an MMU fault
    for record in xids:
        if record.pid in {r["pid"] for r in reports.values()}:
            assert record.name == "python"
            assert normalize_pci(record.pci) == normalize_pci(bus)
            assert may_open_incident(record)


def test_nvml_reports_the_same_xids_on_the_same_gpu_as_they_happen(folder):
    events = nvml_xids(folder)
    kernel = [r.xid for r in kernel_records(folder) if r.record_kind == "xid"
              and r.pid in {f["pid"] for f in faults(folder).values()}]
    assert sorted(e["xid"] for e in events) == sorted(kernel)
    uuid, _ = identity(folder)
    assert {e["gpu_id"] for e in events} == {uuid}
    windows = [(f["start_ns"], f["end_ns"] + 5 * 10**9) for f in faults(folder).values()]
    for event in events:     # each while (or just after) a faulting kernel ran
        assert any(start <= event["ts"] <= end for start, end in windows), event


def test_the_first_answer_is_an_application_fault_not_the_hardware(folder):
    """The recorded Xids, through the shipped rules on a host whose GPU is this one: the
    application-fault rule answers, with each Xid counted; no hardware rule fires."""
    uuid, bus = identity(folder)
    reports = faults(folder)
    first = min(f["start_ns"] for f in reports.values())
    by_pid = {f["pid"]: f["start_ns"] for f in reports.values()}
    # This run's faults: a machine used before keeps an earlier run's Xids in its log, from
    # before the window the rules read here
    records = [r for r in kernel_records(folder) if r.record_kind == "xid" and r.pid in by_pid]
    extra = [(200 + (by_pid.get(r.pid, first) - first) / 1e9, r) for r in records]
    extra += [(200 + (e["ts"] - first) / 1e9,
               GpuXid(ts=0, gpu_id=e["gpu_id"], xid=e["xid"], source="nvml", simulated=False))
              for e in nvml_xids(folder)]
    findings, engine = run(Synthetic(duration_s=400, identities=[(uuid, bus)], extra=extra),
                           RULES.values())
    firing = {f.rule_id: f for f in findings if f.state == "firing"}
    assert "R36_app_fault_xid13_31_43" in firing, engine.status()
    answer = firing["R36_app_fault_xid13_31_43"]
    assert answer.gpu_id == uuid
    codes = [r.xid for r in records]
    assert (answer.evidence["xid31"], answer.evidence["xid43"], answer.evidence["xid13"]) == \
        (codes.count(31), codes.count(43), codes.count(13))
    assert set(firing) == {"R36_app_fault_xid13_31_43"}     # nothing else, hardware or not
    assert findings[0].rule_id == "R36_app_fault_xid13_31_43"  # and it answered first
