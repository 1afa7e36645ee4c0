"""Schema migrations upgrade older databases in place and keep their data."""

import json
import sqlite3

import pytest
from sqlite_utils import Database

from gpuwhy.errors import StoreError
from gpuwhy.events import Envelope, GpuSample
from gpuwhy.store import open_store
from gpuwhy.store.migrations import migrations, newer_schema
from gpuwhy.store.writer import StoreWriter

GPU = "GPU-8c5a2f6e-0000-4000-8000-00000000000a"
T0 = 1_767_225_600_000_000_000


def _older_store(path, stop_before):
    db = Database(sqlite3.connect(path))
    migrations.apply(db, stop_before=stop_before)
    return db


def test_the_first_schema_upgrades_in_place_with_its_data(tmp_path):
    path = tmp_path / "v1.db"
    old = _older_store(path, "m101_decoded_driver_calls")
    assert [m.name for m in migrations.applied(old)] == ["m001_core_tables"]
    old["gpus"].insert({"id": GPU, "uuid": GPU, "gpu_index": 0, "minor": 0})
    old["gpu_samples"].insert_all([
        {"gpu_id": GPU, "ts": T0 + i, "gpu_util": 90.0 + i, "power_w": 512.25,
         "sm_active": 0.8125, "fb_used_mib": 70000.0, "temp_c": 61.0} for i in range(3)])
    old["gpu_samples"].insert({"gpu_id": "minor:1", "ts": T0, "gpu_util": 3.0})
    old["processes"].insert({"pid": 7, "start_time": 70, "comm": "python", "cgroup": "/a/b.scope"})
    old["events"].insert({"ts": T0, "topic": "gpu", "kind": "gpu_state", "gpu_id": GPU,
                          "body": '{"state": "lost", "detail": "x"}'})
    old["incidents"].insert({"id": 1, "opened_at": T0, "kind": "xid", "gpu_id": GPU})
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.execute("SELECT gpu_id, uuid, ts, gpu_util, power_w, sm_active, fb_used_mib, "
                      "temp_c FROM gpu_samples WHERE gpu_id = ? ORDER BY ts", [GPU]).fetchall()
    assert rows == [(GPU, GPU, T0 + i, 90 + i, 512.25, 0.8125, 70000, 61) for i in range(3)]
    # a sample whose GPU had no gpus row keeps it: the migration made one
    assert db.execute("SELECT gpu_util FROM gpu_samples WHERE gpu_id = 'minor:1'"
                      ).fetchone() == (3,)
    assert db.execute("SELECT comm FROM processes").fetchone() == ("python",)
    assert db.execute("SELECT what FROM gpu_reset_history").fetchone() == ("gpu lost",)
    assert db.execute("SELECT id, uuid FROM incident_list").fetchone() == (1, GPU)
    keys = dict(db.execute("SELECT id, gpu_key FROM gpus"))
    assert len(set(keys.values())) == 2 and None not in keys.values()
    # the upgraded store takes new samples, for old and new GPUs alike
    StoreWriter(db).write_batch([
        Envelope("t", 1, GpuSample(ts=T0 + 10, gpu_id=GPU, source="sim", simulated=True,
                                   fields={"gpu_util": 50.0})),
        Envelope("t", 2, GpuSample(ts=T0 + 10, gpu_id="GPU-new", source="sim", simulated=True,
                                   fields={"gpu_util": 60.0}))])
    assert dict(db.execute("SELECT gpu_id, gpu_util FROM gpu_samples WHERE ts = ?",
                           [T0 + 10])) == {GPU: 50, "GPU-new": 60}
    db.close()


def test_the_gpu_sources_wide_table_is_carried_over_and_compacted(tmp_path):
    path = tmp_path / "v2.db"
    old = _older_store(path, "m601_compact_gpu_samples")
    old["gpus"].insert({"id": GPU, "uuid": GPU, "gpu_index": 3})
    fields = {"gpu_util": 99.0, "sm_active": 0.5, "pcie_tx_bytes_per_s": 1024.0 * 1000,
              "energy_mj": 5_000_000.0, "power_violation_ns": 2e9, "clocks_event_reasons": 4.0,
              "fb_total_mib": 81559.0}
    old["gpu_samples"].insert({"gpu_id": GPU, "ts": T0, "instance": "1", **fields})
    old.close()
    db = open_store(path)
    row = db.execute(f"SELECT gpu_index, instance, {', '.join(fields)} FROM gpu_samples"
                     ).fetchone()
    assert row == (3, "1", *fields.values())
    stored = db.execute("SELECT typeof(sm_active_bp), typeof(energy_j) FROM gpu_sample_data"
                        ).fetchone()
    assert stored == ("integer", "integer")
    db.close()


LINK_FIELDS = {"pcie_link_gen": 5.0, "pcie_link_width": 16.0, "pcie_link_gen_max": 5.0,
               "pcie_link_width_max": 16.0, "nvlink_crc_flit_errors": 7.0,
               "nvlink_crc_data_errors": 2.0, "nvlink_replay_errors": 41.0,
               "nvlink_recovery_errors": 1.0, "row_remap_pending": 1.0}


def test_m111_adds_the_link_and_remap_columns_and_keeps_the_rows(tmp_path):
    from gpuwhy.store.rollups import MINUTE_NS, roll_up_minute

    path = tmp_path / "v110.db"
    old = _older_store(path, "m111_pcie_link_nvlink_errors_remap_pending")
    assert "pcie_link_gen" not in old["gpu_sample_data"].columns_dict
    StoreWriter(old).write_batch([Envelope("t", 1, GpuSample(
        ts=T0, gpu_id=GPU, source="sim", simulated=True,
        fields={"gpu_util": 97.0, "power_w": 512.25, "row_remap_failed": 0.0}))])
    # a rollup row as the m110 store wrote it (its columns only)
    old.execute("INSERT INTO gpu_rollup_data (minute, gpu, instance, samples, gpu_util_max) "
                "SELECT ?, gpu_key, '', 1, 97 FROM gpus WHERE id = ?",
                [T0 // MINUTE_NS * MINUTE_NS, GPU])
    old.conn.commit()
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    columns = ", ".join(LINK_FIELDS)
    # the old row is there as it was; the fields it never had are NULL (not reported), not 0
    assert db.execute(f"SELECT gpu_util, power_w, row_remap_failed, {columns} "
                      "FROM gpu_samples").fetchall() == [(97, 512.25, 0) + (None,) * 9]
    assert db.execute(f"SELECT samples, gpu_util_max, {columns} FROM gpu_rollups"
                      ).fetchall() == [(1, 97) + (None,) * 9]
    # the store round trip: a new sample's fields come back in their units, and roll up
    StoreWriter(db).write_batch([Envelope("t", 2, GpuSample(
        ts=T0 + MINUTE_NS, gpu_id=GPU, source="sim", simulated=True,
        fields={"gpu_util": 50.0, **LINK_FIELDS}))])
    assert db.execute(f"SELECT {columns} FROM gpu_samples WHERE ts = ?",
                      [T0 + MINUTE_NS]).fetchone() == tuple(LINK_FIELDS.values())
    roll_up_minute(db, (T0 + MINUTE_NS) // MINUTE_NS * MINUTE_NS)
    assert db.execute(f"SELECT {columns} FROM gpu_rollups WHERE samples = 1 "
                      "AND gpu_util_max = 50").fetchone() == tuple(LINK_FIELDS.values())
    db.close()


def test_m112_adds_the_fabric_columns_and_keeps_the_rows(tmp_path):
    from gpuwhy.store.rollups import MINUTE_NS, roll_up_minute

    path = tmp_path / "v111.db"
    old = _older_store(path, "m112_fabric_state_health")
    assert "pcie_link_gen" in old["gpu_sample_data"].columns_dict
    assert "fabric_state" not in old["gpu_sample_data"].columns_dict
    StoreWriter(old).write_batch([Envelope("t", 1, GpuSample(
        ts=T0, gpu_id=GPU, source="sim", simulated=True,
        fields={"gpu_util": 97.0, "pcie_link_gen": 5.0, "row_remap_pending": 0.0}))])
    old.conn.commit()
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # the old row as it was; the fabric it never reported is NULL, not 0 (NotSupported)
    assert db.execute("SELECT gpu_util, pcie_link_gen, row_remap_pending, fabric_state, "
                      "fabric_health FROM gpu_samples").fetchall() == [(97, 5, 0, None, None)]
    # a minute in which Fabric Manager finished training (InProgress, then Success) and a
    # later one in which the fabric failed: each keeps its largest code
    minute = (T0 // MINUTE_NS + 1) * MINUTE_NS
    StoreWriter(db).write_batch([
        Envelope("t", 2 + i, GpuSample(ts=minute + i * 10**9, gpu_id=GPU, source="sim",
                                       simulated=True, fields={"fabric_state": state,
                                                               "fabric_health": health}))
        for i, (state, health) in enumerate(((2.0, 0.0), (3.0, 1.0), (3.0, 1.0)))])
    StoreWriter(db).write_batch([Envelope("t", 9, GpuSample(
        ts=minute + MINUTE_NS, gpu_id=GPU, source="sim", simulated=True,
        fields={"fabric_state": 4.0, "fabric_health": 2.0}))])
    assert db.execute("SELECT fabric_state, fabric_health FROM gpu_samples WHERE ts = ?",
                      [minute + MINUTE_NS]).fetchone() == (4, 2)
    roll_up_minute(db, minute)
    roll_up_minute(db, minute + MINUTE_NS)
    assert db.execute("SELECT samples, fabric_state, fabric_health FROM gpu_rollups "
                      "WHERE fabric_state IS NOT NULL ORDER BY minute").fetchall() == [
        (3, 3, 1), (1, 4, 2)]
    db.close()


def test_m118_leaves_device_opens_and_closes_in_device_fds_alone(tmp_path):
    """What the writer stored twice (an events row and a device_fds row) is kept once; an
    open or close that only an events row holds is carried over, not lost."""
    from gpuwhy.identity import ProcessKey
    from gpuwhy.store import queries

    path = tmp_path / "v117.db"
    old = _older_store(path, "m118_device_fds_only")
    key = ProcessKey(7, 70)

    def fd_event(kind, ts, fd, **body):
        return {"ts": ts, "topic": "fd", "kind": kind, "src": "probes", "pid": key.pid,
                "start_time": key.start_time, "dedup_key": f"{fd}@{ts}",
                "body": json.dumps({"fd": fd, "path": "/dev/nvidia0", **body})}

    old["processes"].insert({"pid": key.pid, "start_time": key.start_time, "comm": "python"})
    old["events"].insert_all([
        # stored both ways, as the writer did: fd 3 opened at 10, closed at 20
        fd_event("device_opened", 10, 3, device="nvidiaN", minor=0, how="open",
                 cloexec=True),
        fd_event("device_closed", 20, 3),
        # only here: fd 4 opened by a scan at 30 and closed at 40, fd 5 opened at 50
        fd_event("device_opened", 30, 4, device="nvidiaN", minor=0, how="scan",
                 cloexec=False),
        fd_event("device_closed", 40, 4),
        fd_event("device_opened", 50, 5, device="nvidiaN", minor=0, how="dup",
                 cloexec=False),
        {"ts": 60, "topic": "proc", "kind": "process_exited", "src": "probes",
         "pid": key.pid, "start_time": key.start_time, "dedup_key": "", "body": "{}"},
    ])
    old["device_fds"].insert({"pid": key.pid, "start_time": key.start_time, "fd": 3,
                              "opened_at": 10, "path": "/dev/nvidia0", "device": "nvidiaN",
                              "minor": 0, "how": "open", "scanned": 0, "cloexec": 1,
                              "closed_at": 20})
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert db.execute("select kind from events").fetchall() == [("process_exited",)]
    assert db.execute("select fd, opened_at, closed_at, how, scanned, cloexec "
                      "from device_fds order by fd").fetchall() == [
        (3, 10, 20, "open", 0, 1), (4, 30, 40, "scan", 1, 0), (5, 50, None, "dup", 0, 0)]
    listed = [(e["ts"], e["what"], json.loads(e["detail"]) if e["detail"] != "{}" else {})
              for e in queries.process_events(db, key)]
    assert [(ts, what) for ts, what, _ in listed] == [
        (10, "device_opened"), (20, "device_closed"), (30, "device_opened"),
        (40, "device_closed"), (50, "device_opened"), (60, "process_exited")]
    assert listed[0][2] == {"fd": 3, "path": "/dev/nvidia0", "device": "nvidiaN", "minor": 0,
                            "how": "open", "cloexec": True}
    assert listed[1][2] == {"fd": 3, "path": "/dev/nvidia0"}
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)


def test_m119_leaves_kernel_log_records_in_kernel_log_alone(tmp_path):
    """The events rows that repeated a kernel-log record go; the driver version only they
    held moves to kernel_log, and a record only they held is carried over."""
    path = tmp_path / "v118.db"
    old = _older_store(path, "m119_kernel_log_only")

    def record_event(ts, cursor, kind, **body):
        return {"ts": ts, "topic": "klog", "kind": "kernel_log_record", "src": "klog",
                "gpu_id": GPU, "body": json.dumps({"cursor": cursor, "origin": "journald",
                                                   "boot_id": "b", "record_kind": kind,
                                                   "details": {}, **body})}

    old["kernel_log"].insert({"cursor": "s=1", "ts": 10, "raw_ts": 5, "boot_id": "b",
                              "origin": "journald", "kind": "driver_loaded",
                              "message": "loading", "details": "{}",
                              "line": "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95"})
    old["events"].insert_all([
        record_event(10, "s=1", "driver_loaded", message="loading", driver_version="580.95"),
        # only here (its kernel_log row lost): an Xid 79
        record_event(20, "s=2", "xid", xid=79, pci="0000:3b:00", pid=42, name="python",
                     message="GPU has fallen off the bus.", line="NVRM: Xid (PCI:...): 79"),
        {"ts": 30, "topic": "gpu", "kind": "gpu_state", "gpu_id": GPU,
         "body": '{"state": "lost"}'},
    ])
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert db.execute("select kind from events").fetchall() == [("gpu_state",)]
    assert db.execute("select cursor, ts, raw_ts, kind, xid, pci, gpu_id, pid, name, message, "
                      "driver_version from kernel_log order by ts").fetchall() == [
        ("s=1", 10, 5, "driver_loaded", None, None, None, None, None, "loading", "580.95"),
        ("s=2", 20, None, "xid", 79, "0000:3b:00", GPU, 42, "python",
         "GPU has fallen off the bus.", None)]
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)


def test_a_store_migrated_by_a_newer_gpuwhy_is_refused_at_open(tmp_path):
    path = tmp_path / "newer.db"
    db = open_store(path)
    assert newer_schema(db) == []
    db["_sqlite_migrations"].insert({"migration_set": "gpuwhy", "name": "m999_next",
                                     "applied_at": "2027-01-01 00:00:00+00:00"})
    db["_sqlite_migrations"].insert({"migration_set": "other", "name": "x1",
                                     "applied_at": "2027-01-01 00:00:00+00:00"})
    db.close()
    with pytest.raises(StoreError) as caught:
        open_store(path)       # what the service does at start
    assert str(caught.value).startswith(f"store {path} was written by a newer gpuwhy")
    assert "m999_next" in str(caught.value) and "x1" not in str(caught.value)
    readonly = open_store(path, readonly=True)
    assert newer_schema(readonly) == ["m999_next"]
    readonly.close()
