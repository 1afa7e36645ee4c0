"""Rollups (values, minute boundaries, settling), retention (windows, batches, what is kept)
and the size cap, on a real SQLite store."""

import logging

import pytest

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import (
    DeviceOpened,
    Envelope,
    GpuSample,
    GpuSeen,
    GpuXid,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store.maintenance import ROLLUP_MINUTES_PER_STEP, Maintenance
from gpuwhy.store.retention import DAY_NS, Windows, prune
from gpuwhy.store.rollups import DONE_MARK, MINUTE_NS, get_mark, p95, roll_up
from gpuwhy.store.writer import StoreWriter

S = NS_PER_SECOND
T0 = 1_767_225_600 * S    # a minute boundary
GPU = "GPU-00000000-0000-4000-8000-000000000001"


def _seen(ts=T0):
    return Envelope("t", 0, GpuSeen(ts=ts, gpu_id=GPU, source="sim", simulated=True, uuid=GPU,
                                    index=0, minor=0))


def _sample(ts, **fields):
    return Envelope("t", 0, GpuSample(ts=ts, gpu_id=GPU, source="sim", simulated=True,
                                      fields=fields))


def _rollup(db, minute):
    return db.execute("SELECT * FROM gpu_rollups WHERE minute = ?", [minute]).fetchone()


def test_p95_is_nearest_rank():
    assert p95(list(range(1, 101))) == 95
    assert p95([7]) == 7
    assert p95(list(range(1, 21))) == 19     # ceil(0.95 * 20) = 19th smallest


def test_a_minute_rolls_up_to_min_mean_max_p95(db):
    writer = StoreWriter(db)
    utils = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100] * 6          # 60 samples, one a second
    batch = [_seen()]
    for i, util in enumerate(utils):
        batch.append(_sample(T0 + i * S, gpu_util=float(util), sm_active=util / 100,
                             power_w=100.0 + i, energy_mj=1000.0 * i,
                             clocks_event_reasons=float(1 << (i % 3))))
    batch.append(_sample(T0 + 60 * S, gpu_util=0.0))               # first of the next minute
    writer.write_batch(batch)
    assert roll_up(db, T0 + 60 * S + 29 * S) == 0                  # not settled yet
    assert roll_up(db, T0 + 120 * S + 29 * S) == 1                  # the second is still open
    row = db.execute("SELECT samples, gpu_util_min, gpu_util_mean, gpu_util_max, gpu_util_p95, "
                     "sm_active_min, sm_active_max, power_w_mean, energy_mj, "
                     "clocks_event_reasons, gpu_id FROM gpu_rollups WHERE minute = ?",
                     [T0]).fetchone()
    assert row == (60, 10, 55, 100, 100, 0.1, 1.0, 129.5, 59000, 7, GPU)
    assert get_mark(db, DONE_MARK) == T0 + MINUTE_NS
    assert _rollup(db, T0 + MINUTE_NS) is None
    assert roll_up(db, T0 + 10 * MINUTE_NS) == 1
    assert db.execute("SELECT samples, gpu_util_max FROM gpu_rollups WHERE minute = ?",
                      [T0 + MINUTE_NS]).fetchone() == (1, 0)


def test_rollups_skip_the_gap_when_the_service_was_down(db):
    writer = StoreWriter(db)
    writer.write_batch([_seen(), _sample(T0, gpu_util=5.0), _sample(T0 + DAY_NS, gpu_util=7.0)])
    assert roll_up(db, T0 + 2 * DAY_NS, max_minutes=10) == 2
    assert [r[0] for r in db.execute("SELECT minute FROM gpu_rollup_data ORDER BY minute")] == [
        T0, T0 + DAY_NS]


def _fill_history(db, days=10):
    """One sample a minute for ``days`` days, a process per day, an Xid event per day."""
    writer = StoreWriter(db)
    batch = [_seen()]
    for minute in range(days * 1440):
        batch.append(_sample(T0 + minute * MINUTE_NS, gpu_util=float(minute % 100)))
    for day in range(days):
        key = ProcessKey(100 + day, 1000 + day)
        ts = T0 + day * DAY_NS
        batch += [Envelope("t", 0, ProcessSeen(ts=ts, process=key, comm="job")),
                  Envelope("t", 0, DeviceOpened(ts=ts + S, process=key, fd=3,
                                                path="/dev/nvidia0", device="nvidiaN",
                                                minor=0)),
                  Envelope("t", 0, ProcessExited(ts=ts + 3600 * S, process=key)),
                  Envelope("t", 0, GpuXid(ts=ts, gpu_id=GPU, xid=13, source="sim",
                                          simulated=True))]
    writer.write_batch(batch)


def test_retention_keeps_each_kind_for_its_window(db):
    _fill_history(db, days=10)
    now = T0 + 10 * DAY_NS
    while roll_up(db, now, max_minutes=5000):
        pass
    db["process_seconds"].insert_all([{"pid": 1, "start_time": 1, "second": (T0 + d * DAY_NS) // S}
                                      for d in range(10)])     # the correlator's, in seconds
    windows = Windows(raw_days=3, rollup_days=5, event_days=7)
    result = prune(db, windows, now, batch=500)
    assert [r[0] for r in db.execute("SELECT second FROM process_seconds")] == [
        (T0 + d * DAY_NS) // S for d in (7, 8, 9)]
    assert result.done and result.batches > 10          # many small transactions
    raw_from = db.execute("SELECT min(ts) FROM gpu_sample_data").fetchone()[0]
    assert raw_from == now - 3 * DAY_NS                 # a row exactly at the cutoff stays
    assert db.execute("SELECT min(minute) FROM gpu_rollup_data").fetchone()[0] == \
        now - 5 * DAY_NS
    assert db.execute("SELECT min(ts) FROM events").fetchone()[0] >= now - 7 * DAY_NS
    assert [r[0] for r in db.execute("SELECT pid FROM processes ORDER BY pid")] == list(
        range(103, 110))                                # exited before day 3: gone
    assert db.execute("SELECT count(*) FROM gpu_bindings WHERE pid < 103").fetchone()[0] == 0
    assert result.deleted["gpu_sample_data"] == 7 * 1440
    assert prune(db, windows, now, batch=500).deleted == {}     # idempotent


def test_raw_samples_not_rolled_up_are_never_pruned(db):
    _fill_history(db, days=2)
    now = T0 + 30 * DAY_NS
    prune(db, Windows(raw_days=1, rollup_days=5, event_days=7), now)
    assert db["gpu_sample_data"].count == 2 * 1440      # no rollup yet: all kept
    roll_up(db, now, max_minutes=60)
    prune(db, Windows(raw_days=1, rollup_days=50, event_days=70), now)
    assert db.execute("SELECT min(ts) FROM gpu_sample_data").fetchone()[0] == T0 + 60 * MINUTE_NS


def test_pruning_stops_at_its_time_budget_and_goes_on_later(db):
    _fill_history(db, days=4)
    now = T0 + 4 * DAY_NS
    while roll_up(db, now, max_minutes=5000):
        pass
    windows = Windows(raw_days=1, rollup_days=100, event_days=100)
    first = prune(db, windows, now, batch=50, budget_s=0.0)
    assert not first.done and first.batches == 0          # out of time before any batch
    assert db.execute("SELECT min(ts) FROM gpu_sample_data").fetchone()[0] < now - DAY_NS
    later = prune(db, windows, now, batch=50)               # the next step finishes the job
    assert later.done and later.batches > 1
    assert db.execute("SELECT min(ts) FROM gpu_sample_data").fetchone()[0] == now - DAY_NS


def test_open_incidents_are_kept_closed_old_ones_go(db):
    db["incidents"].insert_all([
        {"id": 1, "opened_at": T0, "closed_at": T0 + S, "kind": "xid"},
        {"id": 2, "opened_at": T0, "closed_at": None, "kind": "xid"}])
    db["incident_links"].insert_all([{"incident_id": 1, "seq": 1, "kind": "xid"},
                                     {"incident_id": 2, "seq": 1, "kind": "xid"}])
    prune(db, Windows(event_days=1), T0 + 2 * DAY_NS)
    assert [r[0] for r in db.execute("SELECT id FROM incidents")] == [2]
    assert [r[0] for r in db.execute("SELECT incident_id FROM incident_links")] == [2]


def test_maintenance_warns_before_the_cap_then_sheds_raw_samples(db, tmp_config, caplog):
    _fill_history(db, days=3)
    now = T0 + 3 * DAY_NS
    roomy = Maintenance(tmp_config, db)
    assert roomy.step(now) is True                       # more minutes wait: call again
    assert roomy.totals["rolled_up_minutes"] == ROLLUP_MINUTES_PER_STEP
    while roomy.step(now):
        pass
    assert roomy.totals["rolled_up_minutes"] == 3 * 1440 - 1
    assert roomy.health()[0] == "ok"
    used = roomy.size.used_bytes / 1e6
    near = Maintenance(tmp_config.replace({"store.max_mb": used / 0.9}), db)
    with caplog.at_level(logging.WARNING, logger="gpuwhy.store.maintenance"):
        assert near.step(now) is False
    state, detail, _ = near.health()
    assert state == "degraded" and detail.startswith("warning:")
    assert "nearing its size cap" in caplog.text and near.totals["shed_raw_rows"] == 0
    tight = Maintenance(tmp_config.replace({"store.max_mb": used / 4}), db)
    before = db["gpu_sample_data"].count
    with caplog.at_level(logging.ERROR, logger="gpuwhy.store.maintenance"):
        assert tight.step(now) is True
    assert "over its size cap" in caplog.text
    assert tight.totals["shed_raw_rows"] > 0
    assert db["gpu_sample_data"].count == before - tight.totals["shed_raw_rows"]
    assert db["gpu_rollup_data"].count == 3 * 1440 - 1   # the rollups stay


def test_maintenance_failure_is_reported_not_raised(db, tmp_config):
    maintenance = Maintenance(tmp_config, db)
    db.execute("DROP TABLE store_state")
    assert maintenance.step(T0) is False
    state, detail, counters = maintenance.health()
    assert state == "degraded" and "store_state" in detail
    assert counters["maintenance_errors"] == 1


@pytest.mark.parametrize("value,field,expected", [
    (572.505, "power_w", 572.505), (0.85351, "sm_active", 0.8535),
    (1.5e9 + 700, "pcie_rx_bytes_per_s", 1_500_000_256), (81559.0, "fb_total_mib", 81559),
    (97.6, "gpu_util", 98), (123456789.0, "energy_mj", 123457000),
    (3_000_000_000.0, "power_violation_ns", 3_000_000_000)])
def test_samples_read_back_in_their_units_with_the_stored_precision(db, value, field,
                                                                     expected):
    StoreWriter(db).write_batch([_seen(), _sample(T0, **{field: value})])
    got = db.execute(f"SELECT {field}, gpu_id, uuid, gpu_index FROM gpu_samples").fetchone()
    assert got == (expected, GPU, GPU, 0)
