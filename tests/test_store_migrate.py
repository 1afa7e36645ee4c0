"""Schema migrations upgrade older databases in place and keep their data."""

import sqlite3

from sqlite_utils import Database

from gpuwhy.events import Envelope, GpuSample
from gpuwhy.store import open_store
from gpuwhy.store.migrations import migrations
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
