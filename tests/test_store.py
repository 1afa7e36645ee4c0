import sqlite3

import pytest

from gpuwhy.errors import StoreError
from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    DriverCallStats,
    Envelope,
    ProcessExited,
    ProcessSeen,
    SourceHealth,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.queries import processes_holding_devices, source_health
from gpuwhy.store.writer import StoreWriter

KEY = ProcessKey(4242, 987654)
TABLES = {"processes", "gpus", "device_fds", "gpu_bindings", "driver_call_stats", "events",
          "gpu_samples", "incidents", "source_health", "driver_calls", "sched_stats"}


def _op(cmd, op, sub, count):
    return {"cmd": cmd, "op": op, "sub": sub, "sub_name": None, "count": count, "errors": 1,
            "latency_sum_ns": 1000 * count, "latency_max_ns": 2000, "bytes": 0,
            "latency_log2": [count]}


def _session():
    return [Envelope("fdtrack", i, e) for i, e in enumerate([
        ProcessSeen(ts=10, process=KEY, comm="python", cmdline="python train.py"),
        DeviceOpened(ts=11, process=KEY, fd=3, path="/dev/nvidiactl", device="nvidiactl"),
        DeviceOpened(ts=12, process=KEY, fd=4, path="/dev/nvidia1", device="nvidiaN", minor=1),
        DriverCallStats(ts=13, process=KEY, path="/dev/nvidiactl", device="nvidiactl", ops=[
            _op(0xC020462A, "NV_ESC_RM_CONTROL", 0x20800102, 6),
            _op(0xC020462A, "NV_ESC_RM_CONTROL", 0x2080014A, 5),
            _op(0xC030462B, "NV_ESC_RM_ALLOC", 0x80, 7)]),
        SourceHealth(ts=14, source="fdtrack", state="ok", counters={"records": 2}),
    ], start=1)]


def test_migrations_create_the_schema_in_wal_mode(db):
    assert TABLES <= set(db.table_names()) | set(db.view_names())   # gpu_samples: a view
    assert db.journal_mode == "wal"


def test_migrations_are_applied_once(tmp_path):
    open_store(tmp_path / "a.db").close()
    db = open_store(tmp_path / "a.db")
    names = [r[0] for r in db.execute("select name from _sqlite_migrations")]
    assert len(names) == len(set(names)) >= 1


def test_a_long_lived_connection_keeps_the_page_cache_it_is_given(tmp_path, tmp_config):
    path = tmp_path / "a.db"
    default = open_store(path)
    assert default.execute("PRAGMA cache_size").fetchone()[0] == -2000    # SQLite's own
    for readonly in (False, True):
        db = open_store(path, readonly=readonly, cache_kib=128)
        assert db.execute("PRAGMA cache_size").fetchone()[0] == -128
        db.close()
    default.close()
    from gpuwhy.app.service import Service

    service = Service(tmp_config.replace({"web.port": 0, "store.cache_kib": 96}),
                      with_probes=False, sources={})
    try:
        assert service.db.execute("PRAGMA cache_size").fetchone()[0] == -96   # the writer's
    finally:
        service.stop()


def test_session_is_stored_and_queryable(db):
    StoreWriter(db).write_batch(_session())
    [row] = processes_holding_devices(db)
    assert row["key"] == "4242-987654"
    assert db["driver_call_stats"].count == 3
    assert [d["path"] for d in row["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert row["ioctl_total"] == 18
    assert [(i["name"], i["count"], i["errors"]) for i in row["ioctls"]] == [
        ("NV_ESC_RM_CONTROL", 11, 2), ("NV_ESC_RM_ALLOC", 7, 1)]
    binding = db.execute("select gpu_id, until from gpu_bindings").fetchall()
    assert binding == [("minor:1", None)]
    assert source_health(db)[0]["counters"] == {"records": 2}


def test_replayed_snapshot_changes_nothing(db):
    writer = StoreWriter(db)
    writer.write_batch(_session())
    before = {t: db[t].count for t in TABLES}
    writer.write_batch(_session()[:4])   # a resync re-sends process, fds and counts
    after = {t: db[t].count for t in TABLES}
    assert after == before      # the re-sent opens are the same events: stored once
    assert processes_holding_devices(db)[0]["ioctl_total"] == 18


def test_close_and_exit_end_holdings_and_bindings(db):
    writer = StoreWriter(db)
    writer.write_batch(_session())
    writer.write_batch([Envelope("fdtrack", 9, DeviceClosed(ts=20, process=KEY, fd=3,
                                                            path="/dev/nvidiactl")),
                        Envelope("fdtrack", 10, ProcessExited(ts=21, process=KEY))])
    assert processes_holding_devices(db) == []
    [row] = processes_holding_devices(db, include_exited=True)
    assert row["exited_at"] == 21
    assert db.execute("select until from gpu_bindings").fetchone()[0] == 21


def test_a_failing_batch_leaves_nothing_half_written(db):
    writer = StoreWriter(db)
    batch = _session()
    db.execute("create trigger boom before insert on source_health "
               "begin select raise(abort, 'disk full'); end")
    with pytest.raises(sqlite3.IntegrityError):
        writer.write_batch(batch)
    assert db["processes"].count == 0 and db["device_fds"].count == 0


def test_unopenable_store_is_a_store_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot open store"):
        open_store(tmp_path / "file" / "db.sqlite")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError):
        open_store(garbage)


def test_a_bare_sighting_keeps_what_was_known_of_the_process(db):
    writer = StoreWriter(db)
    writer.write_batch([Envelope("t", 1, ProcessSeen(
        ts=10, process=KEY, comm="python", cmdline="python train.py", exe="/usr/bin/python3",
        ppid=1, uid=0, cgroup="0::/system.slice/train.service", unit="train.service",
        started_at=5))])
    writer.write_batch([Envelope("t", 2, ProcessSeen(ts=20, process=KEY))])   # /proc gone
    writer.write_batch([Envelope("t", 3, ProcessSeen(ts=30, process=KEY, comm="pt_main"))])
    row = db.execute("select comm, cmdline, exe, ppid, uid, cgroup, unit, first_seen, "
                     "last_seen, started_at from processes").fetchone()
    assert row == ("pt_main", "python train.py", "/usr/bin/python3", 1, 0,
                   "0::/system.slice/train.service", "train.service", 10, 30, 5)


def test_a_forked_worker_is_bound_to_the_gpu_only_once_it_calls_the_driver(db):
    parent, worker = ProcessKey(100, 1), ProcessKey(101, 2)
    writer = StoreWriter(db)
    opened = [DeviceOpened(ts=10, process=parent, fd=4, path="/dev/nvidia1", device="nvidiaN",
                           minor=1),
              DeviceOpened(ts=11, process=worker, fd=4, path="/dev/nvidia1", device="nvidiaN",
                           minor=1, how="fork")]
    writer.write_batch([Envelope("fdtrack", i, e) for i, e in enumerate(opened)])
    bound = "select pid, since, evidence from gpu_bindings order by pid"
    assert db.execute(bound).fetchall() == [(100, 10, "holds /dev/nvidia1")]
    calls = DriverCallStats(ts=20, process=worker, path="/dev/nvidia1", device="nvidiaN",
                            ops=[_op(0xC020462A, "NV_ESC_RM_CONTROL", 0x20800102, 2)])
    writer.write_batch([Envelope("fdtrack", 3, calls)])
    assert db.execute(bound).fetchall() == [(100, 10, "holds /dev/nvidia1"),
                                            (101, 20, "calls the driver on /dev/nvidia1")]


def test_a_bad_event_is_rejected_alone_and_leaves_nothing_behind(db):
    writer = StoreWriter(db)
    bad = DriverCallStats(ts=12, process=KEY, path="/dev/nvidia0", device="nvidiaN",
                          ops=[{"cmd": 1}])            # a handler cannot read it: KeyError
    batch = [Envelope("t", 1, ProcessSeen(ts=10, process=KEY, comm="python")),
             Envelope("t", 2, bad),
             Envelope("t", 3, DeviceOpened(ts=13, process=KEY, fd=3, path="/dev/nvidiactl",
                                           device="nvidiactl"))]
    assert writer.write_batch(batch) == 2 and writer.rejected == 1
    assert db["processes"].count == 1 and db["device_fds"].count == 1
    assert db["driver_call_stats"].count == 0 and db["gpu_bindings"].count == 0
    assert writer.write_batch(batch[:1]) == 1 and writer.rejected == 1


def _sample(ts, gpu="GPU-a"):
    from gpuwhy.events import GpuSample

    return GpuSample(ts=ts, gpu_id=gpu, source="sim", simulated=True, fields={"gpu_util": 5.0})


def test_a_gpu_seen_many_times_in_a_batch_ends_with_its_latest_time(db):
    writer = StoreWriter(db)
    writer.write_batch([Envelope("t", i, _sample(ts)) for i, ts in enumerate([30, 10, 50, 20])])
    assert db.execute("select first_seen, last_seen from gpus").fetchall() == [(30, 50)]
    writer.write_batch([Envelope("t", 9, _sample(40))])    # older than stored: kept at 50
    assert db.execute("select last_seen from gpus").fetchone()[0] == 50
    assert db.execute("select count(*) from gpu_sample_data where gpu is null").fetchone()[0] == 0


def test_a_gpu_row_rolled_back_with_a_bad_event_is_written_again(db):
    from gpuwhy.events import GpuSample

    writer = StoreWriter(db)
    bad = GpuSample(ts=11, gpu_id="GPU-b", source="sim", simulated=True,
                    fields={"gpu_util": "garbage"})    # fails after the GPU row is written
    batch = [Envelope("t", 1, bad), Envelope("t", 2, _sample(12, "GPU-b")),
             Envelope("t", 3, _sample(13, "GPU-b"))]
    assert writer.write_batch(batch) == 2 and writer.rejected == 1
    assert db.execute("select id, first_seen, last_seen from gpus").fetchall() == \
        [("GPU-b", 12, 13)]
    assert db.execute("select count(*) from gpu_sample_data where gpu is not null").fetchone() \
        == (2,)


def _mixed_batch(bad=None):
    """Events of every held table (events, sched_stats, gpu_sample_data, driver_call_stats),
    with ``bad`` in the middle."""
    from gpuwhy.events import GpuSample, ProcessExec, SchedStats

    def sched(ts):
        return SchedStats(ts=ts, process=KEY, interval_ns=10**9, own={"on_cpu_ns": ts},
                          workers={})

    def calls(ts, count):
        return DriverCallStats(ts=ts, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
                               ops=[_op(0xC020462A, "NV_ESC_RM_CONTROL", 0x20800102, count)])

    events = [
        ProcessSeen(ts=10, process=KEY, comm="python"),
        DeviceOpened(ts=11, process=KEY, fd=3, path="/dev/nvidiactl", device="nvidiactl"),
        sched(12), calls(13, 5),
        GpuSample(ts=14, gpu_id="GPU-a", source="sim", simulated=True,
                  fields={"gpu_util": 5.0}),
        ProcessExec(ts=15, process=KEY, filename="/usr/bin/python3"),
        *([bad] if bad else []),
        DeviceClosed(ts=17, process=KEY, fd=3, path="/dev/nvidiactl"),
        sched(18), calls(19, 8),
        GpuSample(ts=20, gpu_id="GPU-a", source="sim", simulated=True,
                  fields={"gpu_util": 7.0}),
    ]
    return [Envelope("t", i, e) for i, e in enumerate(events, start=1)]


def _held_tables(db):
    return {table: db.execute(f"select * from {table} order by rowid").fetchall()
            for table in ("events", "sched_stats", "driver_call_stats", "device_fds")} | {
        "gpu_sample_data": db.execute("select * from gpu_sample_data order by ts").fetchall()}


def test_a_bad_event_among_held_rows_is_rejected_and_the_rest_stored_in_order(db, tmp_path):
    # its first op is held before the second fails: nothing of it may be written
    bad = DriverCallStats(ts=16, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
                          ops=[_op(0xC030462B, "NV_ESC_RM_ALLOC", 0x80, 3), {"cmd": 1}])
    writer = StoreWriter(db)
    assert writer.write_batch(_mixed_batch(bad)) == 10 and writer.rejected == 1
    assert db.execute("select kind, ts from events order by id").fetchall() == [
        ("process_exec", 15)]
    assert db.execute("select fd, opened_at, closed_at from device_fds").fetchall() == \
        [(3, 11, 17)]
    assert db.execute("select ts from sched_stats order by ts").fetchall() == [(12,), (18,)]
    assert db.execute("select sub, count, updated_at from driver_call_stats").fetchall() == \
        [(0x20800102, 8, 19)]
    assert db.execute("select ts, gpu_util from gpu_samples order by ts").fetchall() == \
        [(14, 5.0), (20, 7.0)]
    # the same rows as a batch without the bad event, and as one batch per event
    for name, batches in (("whole", [_mixed_batch()]),
                          ("each", [[e] for e in _mixed_batch()])):
        other = open_store(tmp_path / f"{name}.db")
        for batch in batches:
            StoreWriter(other).write_batch(batch)
        assert _held_tables(other) == _held_tables(db), name
        other.close()


def test_driver_call_stats_twice_in_a_batch_leave_the_last_figures(db, tmp_path):
    def calls(ts, **counts):
        return DriverCallStats(ts=ts, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
                               ops=[_op(0xC020462A, "NV_ESC_RM_CONTROL", int(sub[1:]), count)
                                    for sub, count in counts.items()])

    # new rows keep the order they were first written in (rowid), whatever the last order
    events = [calls(10, s1=5), calls(11, s1=6, s2=1), calls(12, s2=4, s1=9)]
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    assert db.execute("select sub, count, errors, latency_sum_ns, latency_log2, updated_at "
                      "from driver_call_stats order by rowid").fetchall() == [
        (1, 9, 1, 9000, "[9]", 12), (2, 4, 1, 4000, "[4]", 12)]
    each = open_store(tmp_path / "each.db")
    for i, event in enumerate(events):
        StoreWriter(each).write_batch([Envelope("t", i, event)])
    assert _held_tables(each) == _held_tables(db)
    each.close()


def test_a_gpu_row_deleted_between_batches_gets_its_new_key(db):
    writer = StoreWriter(db)
    writer.write_batch([Envelope("t", 1, _sample(10, "GPU-a"))])
    db.execute("delete from gpus where id = 'GPU-a'")     # as bindings.learn does a weak id
    writer.write_batch([Envelope("t", 2, _sample(20, "GPU-b")),
                        Envelope("t", 3, _sample(30, "GPU-a"))])
    assert db.execute("select gpu_id, ts from gpu_samples where ts > 10 order by ts").fetchall() \
        == [("GPU-b", 20), ("GPU-a", 30)]


def test_every_writer_handler_is_typed_with_its_event_class():
    import typing

    from gpuwhy.events import EVENT_TYPES

    handlers = [name for name in vars(StoreWriter) if name.startswith("_on_")]
    assert len(handlers) >= 20
    for name in handlers:
        kind = name.removeprefix("_on_")
        assert kind in EVENT_TYPES, name
        hints = typing.get_type_hints(getattr(StoreWriter, name))
        assert hints["event"] is EVENT_TYPES[kind], name


def test_an_operation_whose_figures_did_not_move_is_not_written_again(db):
    writer = StoreWriter(db)

    def calls(ts, **counts):
        return Envelope("t", ts, DriverCallStats(
            ts=ts, process=KEY, path="/dev/nvidiactl", device="nvidiactl",
            ops=[_op(0xC020462A, "NV_ESC_RM_CONTROL", int(sub[1:]), count)
                 for sub, count in counts.items()]))

    writer.write_batch([calls(10, s1=5, s2=3)])
    writer.committed()
    writer.write_batch([calls(20, s1=6, s2=3)])       # the probes send the file's every op
    writer.committed()
    assert db.execute("select sub, count, updated_at from driver_call_stats "
                      "order by sub").fetchall() == [(1, 6, 20), (2, 3, 10)]


def test_figures_of_a_batch_rolled_back_are_written_again(db):
    writer = StoreWriter(db)
    db.execute("create trigger boom before insert on source_health "
               "begin select raise(abort, 'disk full'); end")
    with pytest.raises(sqlite3.IntegrityError):
        writer.write_batch(_session())
    db.execute("drop trigger boom")
    writer.write_batch(_session())                    # the correlator holds and retries it
    writer.committed()
    assert db["driver_call_stats"].count == 3


def test_a_value_sqlite_cannot_store_rejects_its_event_not_the_batch(db):
    from gpuwhy.events import SchedStats

    # rows are bound as built: a list where a number goes fails in SQLite, not in a handler
    bad_sched = SchedStats(ts=12, process=KEY, interval_ns=10**9, own={"on_cpu_ns": [1, 2]},
                           workers={})
    bad_op = _op(0xC020462A, "NV_ESC_RM_CONTROL", 0x20800102, 3) | {"op": {"name": "x"}}
    bad_calls = DriverCallStats(ts=13, process=KEY, path="/dev/nvidiactl",
                                device="nvidiactl", ops=[bad_op])
    writer = StoreWriter(db)
    batch = [Envelope("t", 1, ProcessSeen(ts=10, process=KEY, comm="python")),
             Envelope("t", 2, bad_sched), Envelope("t", 3, bad_calls),
             Envelope("t", 4, DeviceOpened(ts=14, process=KEY, fd=3, path="/dev/nvidiactl",
                                           device="nvidiactl"))]
    assert writer.write_batch(batch) == 2 and writer.rejected == 2
    assert db["sched_stats"].count == 0 and db["driver_call_stats"].count == 0
    assert db["processes"].count == 1 and db["device_fds"].count == 1
    # and the writer goes on: the next batch is written whole
    good = SchedStats(ts=15, process=KEY, interval_ns=10**9, own={"on_cpu_ns": 7}, workers={})
    assert writer.write_batch([Envelope("t", 5, good)]) == 1 and writer.rejected == 2
    assert db.execute("select own_on_cpu_ns from sched_stats").fetchall() == [(7,)]


def test_a_sched_figure_the_store_has_no_column_for_is_left_out(db, caplog):
    from gpuwhy.events import SchedStats

    # a newer probes process's figure, and a name that would break the statement
    event = SchedStats(ts=12, process=KEY, interval_ns=10**9,
                       own={"on_cpu_ns": 5, "gpu_wait_ns": 9, "x] = 1; --": 3},
                       workers={"blocked_ns": 4})
    writer = StoreWriter(db)
    assert writer.write_batch([Envelope("t", 1, event)]) == 1 and writer.rejected == 0
    assert db.execute("select own_on_cpu_ns, workers_blocked_ns from sched_stats").fetchall() \
        == [(5, 4)]
    assert "gpu_wait_ns" in caplog.text


def test_a_sched_frontend_and_engine_loop_are_stored_beside_and_null_without(db):
    from gpuwhy.events import SchedStats

    front = {"on_cpu_ns": 9, "busiest_on_cpu_ns": 8, "threads": 24, "processes": 1}
    loop = {"on_cpu_ns": 7, "busiest_on_cpu_ns": 6, "threads": 30, "processes": 1}
    events = [SchedStats(ts=ts, process=KEY, interval_ns=10**9, own={"on_cpu_ns": 5},
                         workers={"on_cpu_ns": 4}, frontend=frontend, engine_loop=engine_loop)
              for ts, frontend, engine_loop in ((12, front, loop), (13, None, None))]
    writer = StoreWriter(db)
    assert writer.write_batch([Envelope("t", i, e) for i, e in enumerate(events)]) == 2
    assert db.execute("select ts, workers_on_cpu_ns, frontend_busiest_on_cpu_ns, "
                      "frontend_processes, engine_loop_busiest_on_cpu_ns, engine_loop_threads "
                      "from sched_stats order by ts").fetchall() == \
        [(12, 4, 8, 1, 6, 30), (13, 4, None, None, None, None)]


def test_a_close_ends_the_opens_of_its_fd_made_before_it_and_no_later_one(db, tmp_path):
    def opened(ts, fd=3):
        return DeviceOpened(ts=ts, process=KEY, fd=fd, path="/dev/nvidia0", device="nvidiaN",
                            minor=0)

    def closed(ts, fd=3):
        return DeviceClosed(ts=ts, process=KEY, fd=fd, path="/dev/nvidia0")

    events = [opened(10), closed(20), opened(30), opened(31, fd=4), closed(40, fd=4),
              ProcessExited(ts=50, process=KEY), opened(60, fd=5)]
    fds = "select fd, opened_at, closed_at from device_fds order by opened_at"
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    assert db.execute(fds).fetchall() == [(3, 10, 20), (3, 30, 50), (4, 31, 40), (5, 60, None)]
    each = open_store(tmp_path / "each.db")       # the same, one batch per event
    for i, event in enumerate(events):
        StoreWriter(each).write_batch([Envelope("t", i, event)])
    assert each.execute(fds).fetchall() == db.execute(fds).fetchall()
    each.close()
    # an open that came after its own close (the close was sent first) is not left open
    late = open_store(tmp_path / "late.db")
    StoreWriter(late).write_batch([Envelope("t", 1, closed(80)), Envelope("t", 2, opened(70))])
    assert late.execute(fds).fetchall() == [(3, 70, 80)]
    late.close()


def test_exits_held_together_keep_each_fd_its_own_close(db, tmp_path):
    """A batch's exits run as one statement each for all of them, after every row: a fd
    closed before its process exited keeps its close time, whichever exit came first."""
    other, short = ProcessKey(5000, 1), ProcessKey(5001, 2)
    events = [ProcessSeen(ts=1, process=other, comm="sh"),
              ProcessExited(ts=2, process=other, exit_code=3),       # an exit before the close
              ProcessSeen(ts=3, process=KEY, comm="python"),
              DeviceOpened(ts=4, process=KEY, fd=3, path="/dev/nvidia0", device="nvidiaN",
                           minor=0),
              DeviceOpened(ts=5, process=KEY, fd=4, path="/dev/nvidiactl", device="nvidiactl"),
              DeviceClosed(ts=6, process=KEY, fd=3, path="/dev/nvidia0"),
              ProcessSeen(ts=7, process=short, comm="true"),
              ProcessExited(ts=8, process=short, signal=9),
              ProcessExited(ts=9, process=KEY, exit_code=0)]
    facts = ("select pid, exited_at, last_seen, exit_code, signal from processes order by pid",
             "select fd, opened_at, closed_at from device_fds order by fd",
             "select pid, since, until from gpu_bindings")
    StoreWriter(db).write_batch([Envelope("t", i, e) for i, e in enumerate(events)])
    assert db.execute(facts[0]).fetchall() == [(KEY.pid, 9, 9, 0, None), (5000, 2, 2, 3, None),
                                                (5001, 8, 8, None, 9)]
    assert db.execute(facts[1]).fetchall() == [(3, 4, 6), (4, 5, 9)]
    assert db.execute(facts[2]).fetchall() == [(KEY.pid, 4, 9)]
    each = open_store(tmp_path / "each.db")       # the same, one batch per event
    for i, event in enumerate(events):
        StoreWriter(each).write_batch([Envelope("t", i, event)])
    for sql in facts:
        assert each.execute(sql).fetchall() == db.execute(sql).fetchall()
    each.close()


def test_a_kernel_log_line_sent_twice_in_a_batch_is_stored_once(db):
    from gpuwhy.events import KernelLogRecord

    line = KernelLogRecord(ts=5, cursor="s=1;i=2", origin="journald", boot_id="b",
                           record_kind="xid", xid=79, pci="0000:3b:00.0",
                           message="GPU has fallen off the bus.", line="NVRM: Xid ...")
    writer = StoreWriter(db)
    assert writer.write_batch([Envelope("klog", 1, line), Envelope("klog", 2, line)]) == 2
    assert writer.write_batch([Envelope("klog", 3, line)]) == 1     # and in a later one
    assert db["kernel_log"].count == 1
    assert db.execute("select count(*) from events where kind = 'kernel_log_record'"
                      ).fetchone() == (0,)        # kernel_log is its one home
    assert db.execute("select cursor from source_cursors where source = 'klog'"
                      ).fetchone() == ("s=1;i=2",)


def test_an_exec_names_its_file_on_the_process_row_at_the_batch_end(db):
    """Written with the batch's other held rows: a process row that comes later in the
    batch takes its exec's file too, the last exec of a batch is the one kept, and an event
    rejected in the same batch does not lose it."""
    from gpuwhy.events import ProcessExec, SchedStats

    other = ProcessKey(4343, 111)
    writer = StoreWriter(db)
    assert writer.write_batch([
        Envelope("t", 1, ProcessExec(ts=9, process=other, filename="/opt/venv/bin/torchrun")),
        Envelope("t", 2, ProcessSeen(ts=10, process=other, comm="torchrun")),
        Envelope("t", 3, ProcessSeen(ts=10, process=KEY, comm="bash")),
    ]) == 3
    bad = SchedStats(ts=13, process=KEY, interval_ns=10**9, own={"on_cpu_ns": [1]},
                     workers={})
    assert writer.write_batch([
        Envelope("t", 4, ProcessExec(ts=11, process=KEY, filename="/usr/bin/env")),
        Envelope("t", 5, ProcessExec(ts=12, process=KEY, filename="/usr/bin/python3")),
        Envelope("t", 6, bad),
    ]) == 2 and writer.rejected == 1
    files = dict(db.execute("select pid, exe_filename from processes").fetchall())
    assert files == {KEY.pid: "/usr/bin/python3", other.pid: "/opt/venv/bin/torchrun"}
    assert db.execute("select count(*) from events where kind = 'process_exec'").fetchone() \
        == (3,)
