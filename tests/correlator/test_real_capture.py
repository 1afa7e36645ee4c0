"""A real GPU host's traffic through the real correlator: the incidents must be the facts.

tests/data/real/<gpu>/service/capture.jsonl.gz is what gpuwhy's own GPU (NVML) and kernel-log
(/dev/kmsg) sources, and its eBPF probes where the kit carried bcc (service/probes.log),
published on the kit's H200 while three kernels faulted (an illegal address, then a trap,
then a PyTorch device-side assert, each its own process); service/ holds what the live
gpuwhy service there made of it, and xid/ which pid each kernel had. The kernel log was read
from boot, so a machine used before holds an earlier run's Xids too. gpuwhy's own NVML
clients (its sampler, the recorder) held the GPU's device files throughout.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from gpuwhy.app.rules_cli import read_capture

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/service/capture.jsonl.gz"))


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.name)
def folder(request) -> Path:
    return request.param


def fault_pids(folder: Path) -> dict[str, int]:
    return {kind: json.loads((folder / f"xid/fault-{kind}.json").read_text())["pid"]
            for kind in ("illegal-address", "trap", "torch-assert")}


@functools.cache
def captured(folder: Path) -> tuple:
    return tuple(read_capture(str(folder / "service" / "capture.jsonl.gz")))


@pytest.fixture
def replayed(harness, folder):
    """The capture fed second by second through the correlator."""
    events = captured(folder)
    batch: list = []
    for event in events:
        if batch and event.ts - batch[0].ts >= 1_000_000_000:
            harness.feed(*batch)
            batch = []
        batch.append(event)
    harness.feed(*batch)
    return harness


def test_there_is_a_capture():
    assert RECORDINGS


def test_the_xids_open_one_incident_per_code_as_on_the_host(replayed, folder):
    """Replayed here, the capture opens one incident per Xid code on the GPU, and nothing else
    that stands alone (no lost GPU, no reset, no stalled monitor; a process that died of its
    fault is that Xid's effect); the live service on the host opened the same Xid incidents."""
    live = json.loads((folder / "service" / "incidents.json").read_text())
    ours = [i for i in replayed.incidents() if i["cause_id"] is None]
    assert {i["kind"] for i in ours} == {"xid"}
    assert len(ours) == len(xid_pids(folder))
    assert sorted((i["title"], i["gpu_id"]) for i in ours) == \
        sorted((i["title"], i["gpu_id"]) for i in live if i["kind"] == "xid")
    uuid = next(e.gpu_id for e in captured(folder) if e.kind == "gpu_seen")
    assert {i["gpu_id"] for i in ours} == {uuid}
    xids = {i["id"] for i in ours}
    assert all(i["cause_id"] in xids for i in replayed.incidents() if i["cause_id"] is not None)




def xid_pids(folder: Path) -> dict[int, set[int]]:
    """Per Xid code, the pids the captured kernel-log lines name."""
    out: dict[int, set[int]] = {}
    for event in captured(folder):
        if event.kind == "kernel_log_record" and event.record_kind == "xid" and event.pid:
            out.setdefault(event.xid, set()).add(event.pid)
    return out


def probed(folder: Path) -> dict[int, dict]:
    """pid -> what the probes said of it (its key and command line), where probes ran."""
    return {e.process.pid: {"key": e.process, "cmdline": e.cmdline} for e in captured(folder)
            if e.kind == "process_seen" and e.process is not None}


def test_each_xid_incident_names_the_processes_the_driver_named(replayed, folder):
    """The Xid 31 incident names the illegal-address kernel's process; the Xid 43 incident,
    merged from two programs' faults, names both: each pid the driver's lines of that code
    named, and never a program that was only on the GPU (NVML's last listed, a monitor)."""
    pids = fault_pids(folder)
    named = {}
    for incident in replayed.incidents("xid"):
        code = json.loads(incident["details"])["xid"]
        links = replayed.links(incident["id"])
        named[code] = {link["pid"] for link in links if link["kind"] == "process"}
        summaries = [link["summary"] for link in links if link["kind"] == "process"]
        assert all("(python)" in s for s in summaries), summaries
    assert named == xid_pids(folder)
    assert pids["illegal-address"] in named[31]
    assert {pids["trap"], pids["torch-assert"]} <= named[43]


def test_where_the_probes_saw_the_faulting_processes_the_incident_holds_them(replayed, folder):
    """With probes, each faulting kernel's process is known by its key (pid and start), so
    the incident lists it among its processes; gpuwhy's own NVML clients, on the GPU the
    whole time, are in no Xid incident and stall nothing."""
    seen = probed(folder)
    if not (folder / "service" / "probes.log").exists():
        assert not any(e.kind == "device_opened" for e in captured(folder))
        return
    held = {}
    for incident in replayed.incidents("xid"):
        held[incident["id"]] = {tuple(row) for row in replayed.db.execute(
            "select pid, start_time from incident_processes where incident_id = ?",
            [incident["id"]]).fetchall()}
    everyone = set().union(*held.values())
    for kind, pid in fault_pids(folder).items():
        assert pid in seen, f"the probes never saw the {kind} kernel's process"
        key = seen[pid]["key"]
        assert (key.pid, key.start_time) in everyone, kind
    monitors = {p for p, facts in seen.items() if " -m gpuwhy " in facts["cmdline"]}
    assert monitors, "the kit's own gpuwhy processes were on the GPU"
    assert not {pid for pid, _ in everyone} & monitors
    assert not replayed.incidents("process_stall")
