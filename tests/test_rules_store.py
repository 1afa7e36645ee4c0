"""The engine over the store, end to end: simulator scenarios and host events written by the
real StoreWriter, read back by StoreSignals; findings stored; the service's runner."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from gpuwhy.app.service import unprivileged_sources
from gpuwhy.bus import Subscriber
from gpuwhy.clock import now_ns
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.runner import env_keys, run_rules
from gpuwhy.correlator.rules.signals import FORGET_NS, TRIM_NS, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import (
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    Envelope,
    ProcessExited,
    ProcessSeen,
    RuleFinding,
    SchedStats,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.rules.loader import load_rules
from gpuwhy.store import open_store
from gpuwhy.store.overrides import read_overrides, set_override
from gpuwhy.store.writer import StoreWriter

NS = 10**9
RULES = load_rules()
TRAINER = ProcessKey(4321, 98765)


def host_events(ts: int, tick: int) -> list:
    """A training process on GPU 0 whose four loader workers are CPU-bound."""
    events = []
    if tick == 0:
        events += [ProcessSeen(ts=ts, process=TRAINER, comm="python3",
                               cmdline="python3 train.py --workers 4"),
                   DeviceOpened(ts=ts, process=TRAINER, fd=7, path="/dev/nvidia0",
                                device="nvidiaN", minor=0)]
    own = {"on_cpu_ns": int(0.3e9), "runqueue_ns": int(0.02e9), "sleep_ns": int(2.6e9),
           "blocked_ns": 0, "threads": 3}
    workers = {"on_cpu_ns": int(3.8e9), "runqueue_ns": int(0.05e9), "sleep_ns": int(0.1e9),
               "blocked_ns": 0, "threads": 4}
    events.append(SchedStats(ts=ts, process=TRAINER, interval_ns=NS, own=own, workers=workers,
                             worker_processes=4))
    ops = [{"cmd": 0x2B, "sub": 0, "op": "NV_ESC_RM_ALLOC", "sub_name": None,
            "count": 2 * tick, "errors": 0, "latency_sum_ns": 0, "latency_max_ns": 0,
            "bytes": 0, "latency_log2": []}]
    events.append(DriverCallStats(ts=ts, process=TRAINER, path="/dev/nvidiactl",
                                  device="nvidiactl", ops=ops))
    return events


def fill(db, scenario: str, seconds: int, start: int, with_host: bool = True,
         event_after: float = 60) -> int:
    """Write ``seconds`` of a simulator scenario (plus host events) through the StoreWriter."""
    sim = SimulatedGpus(count=2, scenario=scenario, seed=1, event_after=event_after)
    writer = StoreWriter(db)
    gpus = sim.open()
    batch = [Envelope("gpu", 0, gpu.seen(start, "sim", True)) for gpu in gpus]
    for tick in range(seconds):
        ts = start + tick * NS
        events = [dataclasses.replace(e, ts=ts) for e in sim.read()]
        if with_host:
            events += host_events(ts, tick)
        batch += [Envelope("test", tick, e) for e in events]
    assert writer.write_batch(batch) == len(batch) and writer.rejected == 0
    return start + (seconds - 1) * NS


def evaluate(db_path, end: int, seconds: int, every: int = 10) -> tuple[list, Engine]:
    db = open_store(db_path, readonly=True)
    try:
        engine = Engine(RULES, StoreSignals(db), interval_ns=every * NS)
        findings = []
        for t in range(end - seconds * NS + every * NS, end + 1, every * NS):
            findings += engine.evaluate(t)
        return findings, engine
    finally:
        db.close()


@pytest.fixture
def db_path(tmp_path):
    path = tmp_path / "rules.db"
    open_store(path).close()
    return path


def test_input_starved_simulation_fires_the_starvation_rules(db_path):
    db = open_store(db_path)
    end = fill(db, "input-starved", 400, start=1_764_000_000 * NS)
    db.close()
    findings, engine = evaluate(db_path, end, 400)
    gpus = sorted({f.gpu_id for f in findings})
    firing = {(f.rule_id, f.gpu_id) for f in findings if f.state == "firing"}
    gpu0 = [f for f in findings if f.rule_id == "R01_input_cpu_bound"]
    assert gpu0 and gpu0[0].process == TRAINER and gpu0[0].severity == "warning"
    assert gpu0[0].evidence["idle_share"] == pytest.approx(0.7, abs=0.05)
    assert {("R14_bursty_utilisation", gpu) for gpu in gpus} <= firing
    assert len(gpus) == 2
    # GPU 1 has no process: the process-side rules cannot be evaluated there, and say so
    gpu1 = [s for s in engine.status() if s["rule_id"] == "R01_input_cpu_bound"
            and s["gpu_id"] != gpu0[0].gpu_id]
    assert gpu1 and gpu1[0]["status"] == "not_evaluable"
    assert "proc.sleep_frac" in gpu1[0]["detail"]
    healthy = {"R19_power_cap", "R20_thermal_throttle", "R32_xid79_fallen_off_bus"}
    assert not {rule for rule, _ in firing} & healthy


def test_xid79_simulation_fires_fallen_off_bus_and_the_peer_hang(db_path):
    db = open_store(db_path)
    # the job ran 11 minutes before GPU 0 fell off: R17 needs a sign of peers, here the
    # NVLink traffic of those minutes (read over its 10-minute window, so it must be covered)
    end = fill(db, "xid-79", 1000, start=1_764_000_000 * NS, with_host=False,
               event_after=660)
    db.close()
    findings, _ = evaluate(db_path, end, 340)
    by_rule = {}
    for f in findings:
        by_rule.setdefault(f.rule_id, []).append(f)
    [lost] = [f for f in by_rule["R32_xid79_fallen_off_bus"] if f.state == "firing"]
    assert lost.severity == "critical" and lost.evidence["xid79_gpu_source"] == 1.0
    hang = by_rule["R17_collective_hang"]
    assert hang and hang[0].gpu_id != lost.gpu_id


def test_findings_are_stored_one_row_per_finding(db_path):
    db = open_store(db_path)
    writer = StoreWriter(db)
    base = dict(finding_id="R01:g:1-2:5", rule_id="R01_input_cpu_bound", title="t",
                gpu_id="g", process=ProcessKey(1, 2), window_start=1, root_cause="c",
                verify="v", group="host_starvation")
    # legacy names, as an older rules process sends them: stored on the one scale
    writer.write_batch([
        Envelope("rules", 1, RuleFinding(ts=10, severity="warn", state="firing", window_end=10,
                                         evidence={"idle_share": 0.7}, fixes=["a", "b"],
                                         **base)),
        Envelope("rules", 2, RuleFinding(ts=20, severity="high", state="firing", window_end=20,
                                         evidence={"idle_share": 0.9}, fixes=["a", "b"],
                                         **base)),
        Envelope("rules", 3, RuleFinding(ts=30, severity="high", state="cleared",
                                         window_end=30, **base))])
    [row] = list(db["rule_findings"].rows)
    assert (row["first_ts"], row["last_ts"], row["cleared_at"], row["state"]) == (10, 30, 30,
                                                                                  "cleared")
    assert row["severity"] == "error" and (row["pid"], row["start_time"]) == (1, 2)
    assert json.loads(row["evidence"]) == {"idle_share": 0.9}       # kept from the firing
    assert json.loads(row["fixes"]) == ["a", "b"]
    db.close()


def test_overrides_are_kept_in_the_store_and_reach_the_engine(db_path):
    db = open_store(db_path)
    rule = next(r for r in RULES if r.id == "R19_power_cap")
    set_override(db, rule, enabled="false")
    set_override(db, rule, thresholds={"clock_share": "0.8"})
    assert read_overrides(db)[rule.id].enabled is False
    assert dict(read_overrides(db)[rule.id].params) == {"clock_share": 0.8}
    set_override(db, rule, reset=True, shadow="true")
    override = read_overrides(db)[rule.id]
    assert override.enabled and override.shadow and not override.params
    db.close()


def test_environment_comes_from_the_store_and_a_bare_sighting_keeps_it(tmp_path):
    """env() reads what the probes recorded (ProcessSeen.env, processes.env), no /proc."""
    from gpuwhy.store.streams import process_environment

    db = open_store(str(tmp_path / "g.db"))
    other = ProcessKey(4322, 98766)
    StoreWriter(db).write_batch([
        Envelope("proc", 0, ProcessSeen(ts=NS, process=TRAINER, comm="python3",
                                        env={"CUDA_LAUNCH_BLOCKING": "1"})),
        # seen again by a source that could not read its environment: the known one stays
        Envelope("proc", 1, ProcessSeen(ts=2 * NS, process=TRAINER, comm="python3")),
        Envelope("proc", 2, ProcessSeen(ts=2 * NS, process=other, comm="python3"))])
    assert process_environment(db, TRAINER) == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert process_environment(db, other) is None           # never read: unknown, not ""
    signals = StoreSignals(db)
    signals.begin(3 * NS)
    assert signals.facts(TRAINER).env == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert signals.facts(other).env is None
    assert env_keys(RULES) >= {"CUDA_LAUNCH_BLOCKING", "NCCL_P2P_DISABLE"}
    db.close()


def test_r08_fires_through_the_live_path_on_a_capture_that_carries_the_environment(tmp_path):
    """A capture whose ProcessSeen carries CUDA_LAUNCH_BLOCKING=1, replayed through the
    writer, the store and the rules over the store (gpuwhy rules eval's live path)."""
    from gpuwhy.correlator.rules.live_replay import replay_live

    r08 = [r for r in RULES if r.id == "R08_debug_or_limiting_env"]
    start = now_ns()
    events = [ProcessSeen(ts=start, process=TRAINER, comm="python3",
                          cmdline="python3 train.py", env={"CUDA_LAUNCH_BLOCKING": "1"}),
              DeviceOpened(ts=start, process=TRAINER, fd=7, path="/dev/nvidia0",
                           device="nvidiaN", minor=0)]
    events += [dataclasses.replace(e, ts=start + tick * NS)
               for tick in range(1, 40) for e in host_events(start, tick)]
    fired: list = []
    replay_live(events, r08, 10 * NS, tmp_path,
                lambda now, new, verdicts: fired.extend(f for f in new if f.state == "firing"))
    assert [f.rule_id for f in fired] == ["R08_debug_or_limiting_env"]
    assert fired[0].process == TRAINER


def _first_finding_and_health(config) -> tuple:
    """Run the rules runner over a store holding 90 s of a GPU fallen off the bus, until
    the bus has carried its first finding and its health (envelopes; None for what did not
    come within 20 s); the runner must then stop when told."""
    db = open_store(config["store.path"])
    fill(db, "xid-79", 90, start=now_ns() - 90 * NS, with_host=False)
    db.close()
    subscriber = Subscriber(config["bus.endpoint"], topics=("rule", "health"))
    stop = threading.Event()
    thread = threading.Thread(target=run_rules, args=(config, stop), daemon=True)
    thread.start()
    found, health = None, None
    try:
        deadline = now_ns() + 20 * NS
        while now_ns() < deadline and (found is None or health is None):
            envelope = subscriber.receive(0.2)
            if envelope is None:
                continue
            if isinstance(envelope.event, RuleFinding):
                found = found or envelope
            elif envelope.event.source == "rules":
                health = envelope
    finally:
        stop.set()
        thread.join(5)
        subscriber.close()
    assert not thread.is_alive()
    return found, health


def test_the_service_runs_the_rules_and_findings_reach_the_bus(tmp_config):
    assert unprivileged_sources(tmp_config)["rules"] is run_rules
    found, health = _first_finding_and_health(tmp_config.replace({"rules.interval": 0.2}))
    assert found is not None and found.event.rule_id == "R32_xid79_fallen_off_bus"
    assert health is not None and health.event.state == "ok"
    assert f"{len(RULES)} rules" in health.event.detail
    assert health.event.counters["rows_held"] > 90     # a round read the GPUs' 90 s already


def test_a_broken_extra_rule_file_costs_only_its_rules_and_status_names_it(tmp_config,
                                                                           tmp_path):
    folder = tmp_path / "rules.d"
    folder.mkdir()
    (folder / "good.rules").write_text('rule X1_extra { title: "t" when: gpu.util > 2 }\n')
    (folder / "broken.rules").write_text(
        'rule X2_extra { title: "t" when: gpu.util > 2 }\n'
        'rule X3_broken {\n  title: "t"\n  when: mean(gpu.util, ' + "9" * 309 + 's) > 1\n}\n'
        'rule R32_xid79_fallen_off_bus { title: "replaced?" when: gpu.util > 2 }\n')
    config = tmp_config.replace({"rules.interval": 0.2, "rules.paths": str(folder)})
    found, health = _first_finding_and_health(config)
    # Every shipped rule still runs (and the shipped R32 is not replaced), with the good extras.
    assert found is not None and found.event.rule_id == "R32_xid79_fallen_off_bus"
    assert found.event.title == "GPU has fallen off the bus (Xid 79)"
    assert health is not None and health.event.state == "degraded"
    detail = health.event.detail
    assert detail.startswith(f"{len(RULES) + 2} rules; ")
    assert f"2 broken rule(s) not loaded: {folder / 'broken.rules'}:4:24: duration too large " \
           "(max 7d)" in detail
    assert f"{folder / 'broken.rules'}:6:1: rule R32_xid79_fallen_off_bus is already " \
           "defined at builtin/g_failures.rules:" in detail
    assert health.event.counters["rule_problems"] == 2
    # ... and `gpuwhy status` shows it, from the store.
    from gpuwhy.app.status import collect_status

    db = open_store(config["store.path"])
    StoreWriter(db).write_batch([health])
    db.close()
    [part] = [p for p in collect_status(config)["parts"] if p["part"] == "rules"]
    assert part["state"] == "degraded" and f"{folder / 'broken.rules'}:4:24" in part["detail"]


def _fed_both_ways(spec, db_path) -> tuple:
    """The synthetic host's events fed to MemorySignals and, through the StoreWriter, to the
    store a StoreSignals reads: the two signals a test compares."""
    from gpuwhy.correlator.rules.signals import MemorySignals

    events = spec.events()
    db = open_store(db_path)
    assert StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)]) \
        == len(events)
    db.close()
    memory = MemorySignals()
    memory.feed(events)
    return memory, StoreSignals(open_store(db_path, readonly=True))


def test_cuda_signals_read_from_the_store_equal_those_from_the_bus(db_path):
    """The CUDA uprobes' intervals through the StoreWriter and cuda_stats, read back by
    StoreSignals, give the same cuda.* series as MemorySignals fed the same events; a
    sync-bound process fires R05b over the store."""
    from gpuwhy.app.demo.synthetic_signals import BASE_TS, Synthetic
    from gpuwhy.rules.vocabulary import SIGNALS

    spec = Synthetic(duration_s=300, gpu={"gr_engine_active": 0.5},
                     cuda=lambda t: {"syncs": 40, "sync_frac": 0.5, "pageable_frac": 0.25,
                                     "launches": 1000 + t, "allocs": t % 3, "frees": 1})
    memory, store = _fed_both_ways(spec, db_path)
    end = BASE_TS + 300 * NS
    memory.begin(end)
    store.begin(end)
    scope = Scope(spec.gpu_id(0), spec.process(0, 0))
    names = [name for name, signal in SIGNALS.items() if signal.source == "cuda"]
    assert len(names) == 7
    for name in names:
        expected = memory.series(scope, name, BASE_TS, end)
        assert len(expected) == 300, name
        assert store.series(scope, name, BASE_TS, end) == expected, name
    by_name = dict(zip(names, (memory.series(scope, n, BASE_TS, end)[-1][1] for n in names),
                       strict=True))
    assert by_name["cuda.launch_rate"] == 1300 and by_name["cuda.sync_rate"] == 40
    assert by_name["cuda.sync_frac"] == 0.5 and by_name["cuda.pageable_frac"] == 0.25

    engine = Engine([r for r in RULES if r.id == "R05b_cuda_sync_bound"], store,
                    interval_ns=10 * NS)
    findings = []
    for t in range(10, 301, 10):
        findings += engine.evaluate(BASE_TS + t * NS)
    assert [f.rule_id for f in findings if f.state == "firing"] == ["R05b_cuda_sync_bound"]



def test_a_gpus_exits_are_those_of_its_own_processes_from_the_store_as_from_the_bus(db_path):
    """proc.exit in a GPU's rules: exits of processes bound to that GPU, once a GPU each, the
    same read back from the store as fed from the bus; the host's other processes and the
    GPU monitors are not there."""
    from gpuwhy.app.demo.synthetic_signals import BASE_TS, Synthetic

    def opened(key, minor):
        return DeviceOpened(ts=0, process=key, fd=5 + minor, path=f"/dev/nvidia{minor}",
                            device="nvidiaN", minor=minor)

    both, one, host, smi = (ProcessKey(30_000 + n, 500_000 + n) for n in range(4))
    extra = [(10, ProcessSeen(ts=0, process=both, comm="python3", cmdline="train.py")),
             (11, opened(both, 0)), (11, opened(both, 1)),
             (12, ProcessSeen(ts=0, process=one, comm="python3", cmdline="eval.py")),
             (13, opened(one, 1)),
             (14, ProcessSeen(ts=0, process=host, comm="sh", cmdline="sh -c check")),
             (15, ProcessSeen(ts=0, process=smi, comm="nvidia-smi", cmdline="nvidia-smi")),
             (16, opened(smi, 0)),
             (20, ProcessExited(ts=0, process=host, exit_code=1)),
             (21, ProcessExited(ts=0, process=smi, exit_code=0)),
             (30, ProcessExited(ts=0, process=one, exit_code=2)),
             (40, ProcessExited(ts=0, process=both, signal=9))]
    spec = Synthetic(duration_s=60, gpus=2, processes=0, extra=extra)
    memory, store = _fed_both_ways(spec, db_path)
    end = BASE_TS + 60 * NS
    expected = {0: [(40, both, None, 9)], 1: [(30, one, 2, None), (40, both, None, 9)]}
    for gpu in (0, 1):
        for scope in (Scope(spec.gpu_id(gpu)), Scope(spec.gpu_id(gpu), both)):
            read = []
            for signals in (memory, store):
                signals.begin(end)
                rows = signals.events(scope, "proc.exit", BASE_TS, end)
                read.append([((ts - BASE_TS) // NS, row["_process"], row["exit_code"],
                              row["signal"], row["own"]) for ts, row in rows])
            own = [float(scope.process == key) for _, key, *_ in expected[gpu]]
            assert read[0] == read[1] == [(*row, mine) for row, mine
                                          in zip(expected[gpu], own, strict=True)], scope


def _call(ts: int) -> Envelope:
    return Envelope("probes", ts, DriverCall(
        ts=ts, process=TRAINER, tid=TRAINER.pid, fd=7, path="/dev/nvidia0",
        device="nvidiaN", cmd=0xC020462A, nr=0x2A, size=32, op="NV_ESC_RM_CONTROL",
        latency_ns=20_000_000, ret=0, sub_name="NV2080_CTRL_CMD_GPU_GET_INFO",
        reasons=["slow"]))


def test_a_busy_stream_is_read_once_then_only_what_is_new_late_rows_included(tmp_path):
    db = open_store(tmp_path / "s.db")
    writer = StoreWriter(db)
    t0 = now_ns() - 600 * NS
    writer.write_batch([_call(t0 + s * NS) for s in range(10, 21)])
    signals = StoreSignals(db)
    scope = Scope("GPU-0", TRAINER)

    def seen(reader: StoreSignals, now_s: int, window_s: int = 60) -> list[int]:
        reader.begin(t0 + now_s * NS)
        rows = reader.event_rows("driver.call", scope, t0 + (now_s - window_s) * NS,
                                 t0 + now_s * NS)
        return [(ts - t0) // NS for ts, _ in rows]

    assert seen(signals, 30) == list(range(10, 21))
    # written after that round: one from 3 s before it (late, as a batch can be), two after
    writer.write_batch([_call(t0 + 27 * NS), _call(t0 + 33 * NS), _call(t0 + 38 * NS)])
    assert seen(signals, 40) == [*range(10, 21), 27, 33, 38]
    assert seen(signals, 40, window_s=15) == [27, 33, 38]     # another rule's shorter window
    assert seen(signals, 90) == [33, 38]                       # the window moved on
    for now_s in (40, 90):      # what a fresh reader of the whole window reads, round by round
        assert seen(StoreSignals(db), now_s) == seen(signals, now_s)


def test_call_counts_add_up_operations_sent_only_when_they_moved(db_path):
    """A driver_call_stats event holds the operations that moved since the last one (the
    probes' flush): the signals of the bus and of the store both keep the others'
    latest figures, so the totals are those of every operation on every device path."""
    from gpuwhy.correlator.rules.signals import MemorySignals

    def op(cmd, sub, name, count, errors=0):
        return {"cmd": cmd, "op": name, "sub": sub, "sub_name": "", "count": count,
                "errors": errors, "latency_sum_ns": 100 * count, "latency_max_ns": 100,
                "bytes": 0, "latency_log2": [0] * 32}

    control, alloc = (0xC020462A, "NV_ESC_RM_CONTROL"), (0xC030462B, "NV_ESC_RM_ALLOC")
    base = 1_700_000_000 * NS
    events = [
        DriverCallStats(ts=base + NS, process=TRAINER, path="/dev/nvidiactl",
                        device="nvidiactl", ops=[op(*control, 1, 5), op(*alloc, 2, 2, 1)]),
        DriverCallStats(ts=base + 2 * NS, process=TRAINER, path="/dev/nvidia0",
                        device="nvidiaN", ops=[op(*control, 1, 3)]),
        DriverCallStats(ts=base + 3 * NS, process=TRAINER, path="/dev/nvidiactl",
                        device="nvidiactl", ops=[op(*control, 1, 9)]),
    ]
    memory = MemorySignals()
    memory.feed(events)
    memory.begin(base + 3 * NS)
    scope = Scope("GPU-x", TRAINER)
    totals = [value for _, value in memory.series(scope, "proc.ioctl.total", base, base + 3 * NS)]
    assert totals == [7, 10, 14]          # 5+2, then +3 on nvidia0, then 9+2+3
    assert memory.series(scope, "proc.ioctl.errors", base, base + 3 * NS)[-1][1] == 1

    db = open_store(db_path)
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    db.close()
    store = StoreSignals(open_store(db_path, readonly=True))
    store.begin(base + 3 * NS)
    assert store.series(scope, "proc.ioctl.total", base, base + 3 * NS)[-1][1] == 14


def test_rows_are_held_only_as_far_back_as_the_windows_asked_lately(db_path):
    """Between rounds the signals hold what the rules' windows reach, not every hour since
    the start: a minute's window asked for 40 minutes holds about a minute of rows; a half
    hour asked once holds its half hour until nobody asked for it in FORGET_NS; a process
    nobody asks about any more is let go. Every answer is what a fresh reader reads."""
    db = open_store(db_path)
    start = 1_764_000_000 * NS
    fill(db, "healthy-training", 5400, start)
    gpu = db.execute("select id from gpus order by id").fetchone()[0]
    signals = StoreSignals(db)

    def ask(t: int, seconds: int, reader: StoreSignals = signals,
            process: bool = False) -> list:
        now = start + t * NS
        reader.begin(now)
        if process:
            reader.call_rows(TRAINER, now - seconds * NS, now)
            return reader.series(Scope(gpu, TRAINER), "proc.oncpu_frac", now - seconds * NS,
                                 now)
        return reader.series(Scope(gpu, None), "gpu.util", now - seconds * NS, now)

    assert ask(600, 60, process=True) == ask(600, 60, StoreSignals(db), process=True) != []
    for t in range(610, 3000, 10):              # 40 minutes of one-minute windows
        assert len(ask(t, 60)) == 61
    held_minute = signals.held_rows()
    assert 61 <= held_minute <= 61 + TRIM_NS // NS + 2 + 400    # + the process's, for now

    half_hour = ask(3000, 1800)
    assert half_hour == ask(3000, 1800, StoreSignals(db)) and len(half_hour) == 1801
    assert signals.held_rows() >= 1801
    forgotten = 3000 + FORGET_NS // NS + 20
    for t in range(3010, forgotten + 1, 10):    # one-minute windows again
        assert ask(t, 60) == ask(t, 60, StoreSignals(db))
    assert signals.held_rows() <= 61 + TRIM_NS // NS + 1    # the half hour and the process gone
    assert TRAINER not in signals._snapshots


def test_the_runners_health_names_env_a_rule_reads_that_the_probes_do_not_record(tmp_path):
    from gpuwhy.config import load_config
    from gpuwhy.correlator.rules.runner import RulesRunner, unrecorded_env
    from gpuwhy.rules.loader import rules_from_bytes

    user = rules_from_bytes(b'rule X9_env {\n  title: "t"\n  scope: process\n'
                            b'  when: env("MY_FLAG") == "1" or env("NCCL_DEBUG") == "INFO"\n}\n',
                            "user.rules").rules
    assert [r.id for r in user] == ["X9_env"]
    config = load_config(environ={"GPUWHY_DB": str(tmp_path / "g.db")})
    assert unrecorded_env(RULES, config) == []           # the default covers the shipped
    assert unrecorded_env([*RULES, *user], config) == ["MY_FLAG"]

    class Bus:
        def __init__(self):
            self.sent = []

        def publish(self, event):
            self.sent.append(event)
            return True

    db = open_store(config["store.path"])
    signals = StoreSignals(db)
    bus = Bus()
    RulesRunner(Engine([*RULES, *user], signals), signals, bus, 1.0,
                unrecorded=unrecorded_env([*RULES, *user], config)).publish_health()
    [health] = bus.sent
    assert health.state == "degraded" and health.counters["env_unrecorded"] == 1
    assert "add them to probes.environment): MY_FLAG" in health.detail
    db.close()
