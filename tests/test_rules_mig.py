"""MIG instances through the rules: their samples kept apart from the whole GPU's (replay, a
capture read back, the store), a ``scope: instance`` rule evaluated per instance, and its
finding naming the instance and its profile."""

from __future__ import annotations

import json

import pytest

from gpuwhy.app.demo.synthetic_signals import BASE_TS, Synthetic, run
from gpuwhy.app.rules_cli import read_capture, replay
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.errors import GpuwhyError
from gpuwhy.events import Envelope, GpuSample, GpuSeen, RuleFinding
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.parser import parse_rules
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.wire import to_payload

NS = 10**9
R47 = "R47_mig_instance_allocated_but_idle"
RULES = {rule.id: rule for rule in load_rules()}
IDLE_SLICE = {"gr_engine_active": 0.0, "sm_active": 0.0, "dram_active": 0.0,
              "fb_used_mib": 8210.0}
# GPU 0 split in 1g.10gb instances: 9 holds a notebook's 8 GiB and does nothing, 10 and 11
# are busy, 12 is empty (a few MiB, no activity)
HOST = Synthetic(duration_s=1300, step_s=5, instances={
    "9": ("1g.10gb", IDLE_SLICE), "10": ("1g.10gb", {}),
    "11": ("1g.10gb", {"gr_engine_active": 0.64, "fb_used_mib": 5100.0}),
    "12": ("1g.10gb", {"gr_engine_active": 0.0, "sm_active": 0.0, "fb_used_mib": 13.0})})
GPU0 = HOST.gpu_id(0)


def firing(findings: list, rule_id: str = R47) -> list:
    return [f for f in findings if f.rule_id == rule_id and f.state == "firing"]


def test_an_idle_instance_holding_memory_is_answered_and_named():
    findings, engine = run(HOST, [RULES[R47]])
    found = firing(findings)
    assert {f.instance for f in found} == {"9"}
    first, last = found[0], found[-1]
    assert first.gpu_id == GPU0 and first.mig_profile == "1g.10gb"
    assert first.process is None and first.processes == []
    assert ":mig9:" in first.finding_id
    assert first.severity == "info" and last.severity == "warning"   # 15 idle minutes
    assert last.evidence["fb_used_mib"] == pytest.approx(8210.0)
    assert last.evidence["busy"] == 0.0
    statuses = {s["instance"]: s["status"] for s in engine.status()}
    assert statuses == {"9": "firing", "10": "ok", "11": "ok", "12": "ok"}


def test_whole_gpu_signals_do_not_read_instance_samples():
    signals = MemorySignals()
    signals.feed(HOST.events())
    end = BASE_TS + 1300 * NS
    whole = signals.series(Scope(GPU0), "gpu.fb_used", end - 60 * NS, end)
    slice9 = signals.series(Scope(GPU0, instance="9"), "gpu.fb_used", end - 60 * NS, end)
    assert whole and {v for _, v in whole} == {0.88 * 81559.0}
    assert slice9 and {v for _, v in slice9} == {8210.0}
    assert signals.instances(GPU0) == dict.fromkeys(("9", "10", "11", "12"), "1g.10gb")
    # a whole-GPU rule sees the GPU as the healthy host it is
    findings, _ = run(HOST, [RULES["R27_allocated_but_idle"]])
    assert findings == []


def test_no_instances_no_instance_rule_instances():
    _, engine = run(Synthetic(duration_s=120), [RULES[R47]])
    assert engine.status() == []


def test_a_capture_read_back_keeps_the_instances(tmp_path):
    capture = tmp_path / "mig.jsonl"
    capture.write_bytes(b"\n".join(to_payload(e, src="gpu", seq=i)
                                   for i, e in enumerate(HOST.events(), 1)) + b"\n")
    events = read_capture(str(capture))
    kept = [e for e in events if isinstance(e, GpuSample) and e.instance == "9"]
    assert len(kept) == 1300 // 5 and kept[0].labels == {"mig_profile": "1g.10gb"}
    findings, engine = replay(events, [RULES[R47]], 10 * NS)
    assert {(f.instance, f.mig_profile) for f in firing(findings)} == {("9", "1g.10gb")}


def test_the_store_backed_signals_read_instance_series(tmp_path):
    db = open_store(tmp_path / "mig.db")
    writer = StoreWriter(db)
    events = [e for e in HOST.events() if isinstance(e, GpuSample | GpuSeen)]   # the GPU's
    batch = [Envelope("gpu", i, e) for i, e in enumerate(events)]
    assert writer.write_batch(batch[:len(batch) // 2]) > 0
    assert writer.write_batch(batch[len(batch) // 2:]) > 0
    rows = db.execute("select instance, profile, first_seen, last_seen from gpu_instances "
                      "order by instance").fetchall()
    assert [r[:2] for r in rows] == [("10", "1g.10gb"), ("11", "1g.10gb"), ("12", "1g.10gb"),
                                     ("9", "1g.10gb")]
    assert all(r[2] == BASE_TS + 5 * NS and r[3] == BASE_TS + 1300 * NS for r in rows)
    db.close()
    db = open_store(tmp_path / "mig.db", readonly=True)
    try:
        signals = StoreSignals(db)
        end = BASE_TS + 1300 * NS
        signals.begin(end)
        assert list(signals.instances(GPU0)) == ["9", "10", "11", "12"]
        slice9 = signals.series(Scope(GPU0, instance="9"), "gpu.busy", end - 60 * NS, end)
        slice10 = signals.series(Scope(GPU0, instance="10"), "gpu.busy", end - 60 * NS, end)
        whole = signals.series(Scope(GPU0), "gpu.fb_used", end - 60 * NS, end)
        assert slice9 and {v for _, v in slice9} == {0.0}
        assert slice10 and {v for _, v in slice10} == {0.92}
        assert whole and {v for _, v in whole} == {round(0.88 * 81559.0)}   # stored in MiB
        engine = Engine([RULES[R47]], signals, interval_ns=60 * NS)
        found = []
        for t in range(BASE_TS + 360 * NS, end + 1, 60 * NS):
            found += engine.evaluate(t)
        assert {(f.instance, f.mig_profile) for f in firing(found)} == {("9", "1g.10gb")}
    finally:
        db.close()


def test_a_finding_keeps_its_instance_in_the_store(tmp_path):
    db = open_store(tmp_path / "f.db")
    finding = RuleFinding(ts=BASE_TS, finding_id=f"{R47}:{GPU0}:mig9:1", rule_id=R47,
                          title="t", severity="info", state="firing", gpu_id=GPU0,
                          instance="9", mig_profile="1g.10gb")
    StoreWriter(db).write_batch([Envelope("rules", 1, finding)])
    assert db.execute("select instance, mig_profile from rule_findings").fetchall() == \
        [("9", "1g.10gb")]
    decoded = json.loads(to_payload(finding, src="rules", seq=1))
    assert (decoded["instance"], decoded["mig_profile"]) == ("9", "1g.10gb")
    db.close()


def test_an_instance_sample_without_a_profile_keeps_the_one_known():
    signals = MemorySignals()
    signals.feed([GpuSeen(ts=1, gpu_id="g", source="dcgm", simulated=False),
                  GpuSample(ts=2, gpu_id="g", source="dcgm", simulated=False,
                            fields={"fb_used_mib": 1.0}, instance="3",
                            labels={"mig_profile": "3g.40gb"}),
                  GpuSample(ts=3, gpu_id="g", source="dcgm", simulated=False,
                            fields={"fb_used_mib": 1.0}, instance="3")])
    assert signals.instances("g") == {"3": "3g.40gb"}
    assert signals.gpu_rows("g", 0, 10) == []


@pytest.mark.parametrize("name", ["proc.threads", "gpu.procs", "proc.comm"])
def test_an_instance_rule_cannot_read_what_no_instance_has(name):
    text = f"""rule X1 {{
  title: "x"
  kind: symptom
  when: {name} > 0 and mean(gpu.busy, 60s) < 0.1
  scope: instance
}}
"""
    if name == "proc.comm":
        text = text.replace(f"{name} > 0", f'{name} == "a"')
    with pytest.raises(GpuwhyError, match="not known per MIG instance"):
        parse_rules(text, "x.rules")
