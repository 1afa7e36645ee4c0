"""A finding's ``since`` (when its condition first held, not its evaluation window's start)
and ``processes`` (every process it names), through the real engine, the wire and the store."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuwhy.app.demo.synthetic_signals import BASE_TS, NS, Synthetic, run
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.errors import DecodeError
from gpuwhy.events import DeviceOpened, Envelope, ProcessExited, ProcessSeen, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.parser import parse_rules
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.wire import from_frames, json_text, to_payload

R26 = next(rule for rule in load_rules() if rule.id == "R26_multi_process_contention")
JOINS_S = 105     # the second process on GPU 0 starts here


def contention(duration_s: int = 400, leaves_s: int | None = None) -> Synthetic:
    """Two GPUs, one process each from the start; a second process joins GPU 0 later (and
    leaves at ``leaves_s``)."""
    spec = Synthetic(duration_s=duration_s, gpus=2, processes=1)
    late = spec.process(0, 1)
    spec.extra = [(JOINS_S, ProcessSeen(ts=0, process=late, comm="python3",
                                        cmdline="python3 serve.py")),
                  (JOINS_S, DeviceOpened(ts=0, process=late, fd=9, path="/dev/nvidia0",
                                         device="nvidiaN", minor=0))]
    if leaves_s is not None:
        spec.extra.append((leaves_s, ProcessExited(ts=0, process=late, exit_code=0)))
    return spec


def test_since_is_when_the_condition_first_held_not_the_window_start():
    [rule] = parse_rules('rule T_low { title: "t" window: 60s\n'
                         '  when: mean(gpu.util, 10s) < 0.5 for: 10s }', "t.rules")
    spec = Synthetic(duration_s=300, gpu=lambda t: {"gpu_util": 98.0 if t < 200 else 10.0})
    findings, _ = run(spec, [rule])
    [firing] = [f for f in findings if f.state == "firing"]
    # the 10 s mean falls below 0.5 at the evaluation of t=210; 'for: 10s' fires at t=220
    assert firing.since == BASE_TS + 210 * NS
    assert 200 * NS <= firing.since - BASE_TS <= 210 * NS          # ~T, not T - 60 s
    assert firing.ts == BASE_TS + 220 * NS
    assert (firing.window_start, firing.window_end) == (firing.since - 60 * NS, firing.ts)
    assert firing.processes == [spec.process(0, 0)] and firing.process == spec.process(0, 0)


def test_contention_names_every_process_and_is_not_dated_before_the_later_one():
    spec = contention()
    findings, engine = run(spec, [R26])
    gpu0, gpu1 = spec.gpu_id(0), spec.gpu_id(1)
    assert {f.gpu_id for f in findings} == {gpu0}                  # one process: unaffected
    [firing] = findings
    assert firing.state == "firing" and firing.rule_id == R26.id
    assert firing.processes == [spec.process(0, 0), spec.process(0, 1)]
    assert firing.process == spec.process(0, 0)                     # the main one, as before
    joined = BASE_TS + JOINS_S * NS
    assert firing.since >= joined                                   # not before it existed
    assert firing.since - joined <= R26.every_ns                     # R26's first round with both
    assert firing.ts - firing.since >= R26.for_ns
    assert firing.window_start == firing.since - R26.window_ns      # still the window
    assert {s["status"] for s in engine.status() if s["gpu_id"] == gpu1} == {"ok"}


def test_a_clearing_keeps_the_onsets_since_and_processes():
    # back to one process at t=405: the condition fails, and clears 'clear after' later
    [firing, clearing], _ = run(contention(duration_s=800, leaves_s=405), [R26])
    assert clearing.state == "cleared" and clearing.finding_id == firing.finding_id
    assert (clearing.since, clearing.processes) == (firing.since, firing.processes)


def test_a_main_process_that_joined_after_the_onset_dates_the_finding():
    # A GPU rule holding with no process on the GPU; one joins before 'for' is over and is
    # named as the finding's main process: the finding cannot be dated before it existed.
    [rule] = parse_rules('rule T_gpu { title: "t" window: 60s\n'
                         '  when: mean(gpu.util, 10s) >= 0 for: 60s }', "t.rules")
    spec = Synthetic(duration_s=120, processes=0)
    key = ProcessKey(4242, 777)
    spec.extra = [(35, ProcessSeen(ts=0, process=key, comm="python3")),
                  (35, DeviceOpened(ts=0, process=key, fd=5, path="/dev/nvidia0",
                                    device="nvidiaN", minor=0))]
    [firing], _ = run(spec, [rule])
    assert firing.ts == BASE_TS + 70 * NS                 # held from t=10, for 60 s
    assert firing.process == key and firing.processes == [key]
    assert firing.since == BASE_TS + 35 * NS              # not t=10: before the process
    assert firing.window_start == BASE_TS + 10 * NS - 60 * NS


def test_since_and_processes_round_trip_the_wire():
    keys = [ProcessKey(10, 500), ProcessKey(11, 600)]
    finding = RuleFinding(ts=5, finding_id="R:g:-:3", rule_id="R", title="t",
                          severity="warning", state="firing", gpu_id="g", process=keys[0],
                          window_start=1, window_end=5, since=3, processes=keys)
    payload = to_payload(finding, src="rules", seq=1)
    assert json.loads(payload)["processes"] == [{"pid": 10, "start_time": 500},
                                                {"pid": 11, "start_time": 600}]
    decoded = from_frames([b"rule", payload]).event
    assert decoded == finding and decoded.processes == keys
    assert all(isinstance(p, ProcessKey) for p in decoded.processes)
    # the engine's own finding, too
    [engine_finding] = run(contention(), [R26])[0]
    wire = from_frames([b"rule", to_payload(engine_finding, src="rules", seq=2)]).event
    assert wire == engine_finding


def test_an_older_senders_finding_decodes_with_the_defaults():
    old = json.loads(to_payload(RuleFinding(ts=5, finding_id="f", rule_id="R", title="t",
                                            severity="info", state="firing", gpu_id="g"),
                                src="rules", seq=1))
    del old["since"], old["processes"]
    event = from_frames([b"rule", json_text(old).encode()]).event
    assert (event.since, event.processes) == (0, [])
    bad = {**old, "processes": [{"pid": 1}]}
    with pytest.raises(DecodeError):
        from_frames([b"rule", json_text(bad).encode()])
    with pytest.raises(DecodeError):
        from_frames([b"rule", json_text({**old, "processes": 7}).encode()])


def test_the_store_row_has_since_and_processes(tmp_path):
    spec = contention()
    [firing] = run(spec, [R26])[0]
    db = open_store(tmp_path / "s.db")
    writer = StoreWriter(db)
    older_clearing = dataclasses.replace(firing, ts=firing.ts + 300 * NS, state="cleared",
                                         since=0, processes=[])
    writer.write_batch([Envelope("rules", 1, firing), Envelope("rules", 2, older_clearing)])
    [row] = list(db["rule_findings"].rows)
    assert row["state"] == "cleared" and row["since"] == firing.since   # kept from firing
    assert json.loads(row["processes"]) == [{"pid": p.pid, "start_time": p.start_time}
                                            for p in firing.processes]
    assert row["window_start"] == firing.window_start
    legacy = RuleFinding(ts=5, finding_id="old", rule_id="R", title="t", severity="info",
                         state="firing", gpu_id="g")
    writer.write_batch([Envelope("rules", 3, legacy)])
    old_row = db["rule_findings"].get("old")
    assert old_row["since"] is None and old_row["processes"] is None
    db.close()


def test_over_the_store_contention_is_dated_after_both_processes(tmp_path):
    """The engine in the service reads the store: processes, first_seen and samples as the
    StoreWriter wrote them."""
    spec = contention()
    path = tmp_path / "rules.db"
    db = open_store(path)
    writer = StoreWriter(db)
    events = spec.events()
    assert writer.write_batch([Envelope("test", i, e) for i, e in enumerate(events)]) == \
        len(events)
    db.close()
    db = open_store(path, readonly=True)
    try:
        engine = Engine([R26], StoreSignals(db), interval_ns=10 * NS)
        findings = []
        for t in range(10, 401, 10):
            findings += engine.evaluate(BASE_TS + t * NS)
    finally:
        db.close()
    [firing] = findings
    assert firing.gpu_id == spec.gpu_id(0)
    assert firing.processes == [spec.process(0, 0), spec.process(0, 1)]
    assert BASE_TS + JOINS_S * NS <= firing.since <= BASE_TS + 110 * NS + 10 * NS


def test_processes_survive_the_standard_library_fallback(monkeypatch):
    # to_payload falls back to the json module for what orjson refuses: a lone surrogate
    # (a user rule file is read with surrogateescape) or an integer over 64 bits
    from gpuwhy import wire

    monkeypatch.setattr(wire, "orjson", None)
    finding = RuleFinding(ts=5, finding_id="f", rule_id="R", title="t\udcff", severity="info",
                          state="firing", gpu_id="g", since=3, processes=[ProcessKey(1, 2)])
    assert from_frames([b"rule", to_payload(finding, src="rules", seq=1)]).event == finding
