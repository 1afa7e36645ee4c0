"""Process seconds through the real correlator and store: scheduler time and, with the CUDA
uprobes on, launches, syncs, copies and allocations per second."""

import dataclasses

from gpuwhy.app.demo.synthetic_signals import Synthetic
from gpuwhy.correlator.incidents import IncidentBuilder
from gpuwhy.events import CudaStats, DriverCallStats, Envelope, SchedStats
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store

TRAINER = ProcessKey(4242, 1000)


def cuda_seconds(h, values: dict, seconds: list[float]) -> list[CudaStats]:
    template = next(e for e in Synthetic(duration_s=1, cuda=values).events()
                    if isinstance(e, CudaStats))
    return [dataclasses.replace(template, ts=h.at(t), process=TRAINER) for t in seconds]


def test_a_process_second_adds_up_its_scheduler_and_cuda_intervals(harness):
    h = harness
    half = {"on_cpu_ns": 450_000_000, "sleep_ns": 50_000_000}
    h.feed(h.process(0.1, TRAINER, "python3"),     # the probes flush every 0.5 s
           *(SchedStats(ts=h.at(t), process=TRAINER, interval_ns=5 * 10**8, own=half,
                        workers={"on_cpu_ns": 500_000_000}) for t in (1.2, 1.7)))
    # two intervals ending in the same second add up; the next second has its own
    h.feed(*cuda_seconds(h, {"launches": 3000, "syncs": 20, "sync_frac": 0.25,
                             "htod_bytes": 4e8, "dtoh_bytes": 1e8, "pageable_frac": 0.5,
                             "allocs": 7, "frees": 6}, [1.2, 1.9, 2.5]))
    rows = h.db.execute(
        "select second - ?, on_cpu_ms, sleep_ms, workers_on_cpu_ms, cuda_launches, cuda_syncs, "
        "cuda_sync_ms, cuda_htod_bytes, cuda_dtoh_bytes, cuda_pageable_bytes, cuda_allocs, "
        "cuda_frees "
        "from process_seconds where pid = ? order by second",
        [h.t0 // 10**9, TRAINER.pid]).fetchall()
    assert rows == [(1, 900.0, 100.0, 1000.0, 6000, 40, 500.0, 8e8, 2e8, 5e8, 14, 12),
                    (2, None, None, None, 3000, 20, 250.0, 4e8, 1e8, 2.5e8, 7, 6)]


def _calls(ts: int, **counts: int) -> DriverCallStats:
    ops = [{"cmd": 0xC020462A, "sub": sub, "op": "NV_ESC_RM_CONTROL", "sub_name": name,
            "count": counts[name], "errors": 0, "latency_sum_ns": 0, "latency_max_ns": 0,
            "bytes": 0, "latency_log2": []}
           for sub, name in enumerate(("CTRL_A", "CTRL_B", "CTRL_C")) if name in counts]
    return DriverCallStats(ts=ts, process=TRAINER, path="/dev/nvidiactl", device="nvidiactl",
                           ops=ops)


def _sched(ts: int, on_cpu_ns: int) -> SchedStats:
    return SchedStats(ts=ts, process=TRAINER, interval_ns=5 * 10**8,
                      own={"on_cpu_ns": on_cpu_ns, "sleep_ns": 2 * on_cpu_ns},
                      workers={"blocked_ns": on_cpu_ns})


def test_a_batch_of_stats_gives_the_process_second_one_batch_per_event_gives(tmp_config,
                                                                            tmp_path):
    s = 1_700_000_000 * 10**9
    events = [_calls(s + 1, CTRL_A=5, CTRL_B=3), _sched(s + 2, 100_000),
              _calls(s + 3, CTRL_B=4, CTRL_C=2, CTRL_A=5), _sched(s + 4, 200_000),
              _calls(s + 10**9, CTRL_A=6), _sched(s + 5, 300_000),
              _calls(s + 6, CTRL_C=7, CTRL_A=8)]
    # the sums must be added in the order the events came: floats do not reassociate
    assert (0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3)

    def stored(batches: list[list]) -> list[tuple]:
        db = open_store(tmp_path / f"{len(batches)}.db")
        builder = IncidentBuilder(tmp_config)
        for batch in batches:
            builder.decide(db, [Envelope("t", i, e) for i, e in enumerate(batch)])
        rows = db.execute("select * from process_seconds order by second").fetchall()
        db.close()
        return rows

    each = stored([[e] for e in events])
    assert each == stored([events]), "one batch"
    assert each == stored([events[:2], events[2:]]), "two batches"
    # ioctl_ops: each call's ops first, then those stored before it (the text is compared)
    assert [(ioctls, ops, on_cpu) for _, _, _, _, ioctls, ops, on_cpu, *_ in each] == [
        (18, '{"CTRL_A":7,"CTRL_C":7,"CTRL_B":4}', (0.1 + 0.2) + 0.3),
        (1, '{"CTRL_A":1}', None)]


def test_a_stall_is_classified_from_the_scheduler_totals_alone():
    """The decision is a plain function of what the store read (own on-CPU, blocked, sleep,
    run-queue ns, workers' on-CPU ns): no store needed to test it."""
    from gpuwhy.correlator.timeline import classify_stall

    assert classify_stall(None) == "state unknown (no scheduler data)"
    assert classify_stall((None, None, None, None, None)) == \
        "state unknown (no scheduler data)"
    assert classify_stall((0, 0, 0, 0, 0)) == "state unknown (no scheduler time)"
    assert classify_stall((6, 1, 1, 2, 0)).startswith("on-CPU busy")
    assert classify_stall((1, 5, 4, 0, 9)).startswith("blocked")
    assert classify_stall((1, 2, 7, 0, 0)).startswith("waiting")


def test_the_timeline_handlers_compute_without_a_store_and_write_pending_applies(harness):
    """Deciding a batch's process seconds needs no database: the handlers only compute and
    hold (given no store at all here); write_pending applies them, in arrival order."""
    from gpuwhy.correlator.timeline import TimelineBuilder
    from gpuwhy.events import GpuProcesses

    h = harness
    builder = TimelineBuilder()
    events = [*cuda_seconds(h, {"launches": 3000, "syncs": 20}, [1.2, 1.9]),
              _sched(h.at(1.5), 100_000_000),
              GpuProcesses(ts=h.at(1.4), gpu_id="GPU-1", source="nvml", processes=[
                  {"pid": TRAINER.pid, "start_time": TRAINER.start_time, "sm_util": 40,
                   "used_memory_mib": 1024.0}])]
    for event in events:
        handler = builder.handler(event.kind)
        assert handler is not None
        handler(None, event)              # no store: a handler that wrote would fail here
    second = h.at(1) // 10**9
    assert h.db.execute("select count(*) from process_seconds").fetchone() == (0,)
    builder.write_pending(h.db)
    assert h.db.execute(
        "select cuda_launches, cuda_syncs, on_cpu_ms, sm_util, used_memory_mib, gpu_id "
        "from process_seconds where pid = ? and second = ?",
        [TRAINER.pid, second]).fetchone() == (6000, 40, 100.0, 40, 1024.0, "GPU-1")
    builder.discard_pending()
    builder.write_pending(h.db)           # nothing held twice
    assert h.db.execute("select cuda_launches from process_seconds where pid = ?",
                        [TRAINER.pid]).fetchone() == (6000,)
