"""A real GPU host's traffic through the real correlator: the incidents must be the facts.

tests/data/real/<gpu>/service/capture.jsonl is what gpuwhy's own GPU (NVML) and kernel-log
(/dev/kmsg) sources published on the kit's H200 while three kernels faulted (an illegal
address, then a trap, then a PyTorch device-side assert, each its own process); service/
holds what the live `gpuwhy serve` there made of it, and xid/ which pid each kernel had.
No eBPF probes ran there: gpuwhy never saw those processes start, only the driver's lines
name them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwhy.correlator.rules.cli import read_capture

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/service/capture.jsonl"))


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.name)
def folder(request) -> Path:
    return request.param


def fault_pids(folder: Path) -> dict[str, int]:
    return {kind: json.loads((folder / f"xid/fault-{kind}.json").read_text())["pid"]
            for kind in ("illegal-address", "trap", "torch-assert")}


@pytest.fixture
def replayed(harness, folder):
    """The capture fed second by second through the correlator."""
    events = read_capture(str(folder / "service" / "capture.jsonl"))
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


def test_the_xids_open_the_incidents_the_live_service_opened(replayed, folder):
    """Replayed here, the capture opens what `gpuwhy serve` opened on the GPU host: one
    incident per Xid code on the GPU, nothing else (no lost GPU, no reset)."""
    live = json.loads((folder / "service" / "incidents.json").read_text())
    ours = replayed.incidents()
    assert sorted((i["kind"], i["title"], i["gpu_id"]) for i in ours) == \
        sorted((i["kind"], i["title"], i["gpu_id"]) for i in live)
    assert {i["kind"] for i in ours} == {"xid"}
    uuid = next(e.gpu_id for e in read_capture(str(folder / "service" / "capture.jsonl"))
                if e.kind == "gpu_seen")
    assert {i["gpu_id"] for i in ours} == {uuid}


def test_each_xid_incident_names_the_processes_the_driver_named(replayed, folder):
    """The Xid 31 incident names the illegal-address kernel's process; the Xid 43 incident,
    merged from two programs' faults, names both, and never the earlier program that NVML
    last listed on the GPU (gone by then)."""
    pids = fault_pids(folder)
    named = {}
    for incident in replayed.incidents("xid"):
        code = json.loads(incident["details"])["xid"]
        links = replayed.links(incident["id"])
        named[code] = {link["pid"] for link in links if link["kind"] == "process"}
        summaries = [link["summary"] for link in links if link["kind"] == "process"]
        assert all("(python)" in s for s in summaries), summaries
    assert named[31] == {pids["illegal-address"]}
    assert named[43] == {pids["trap"], pids["torch-assert"]}
