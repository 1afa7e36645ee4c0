"""Downsampling: long ranges read the one-minute rollups (weighted means), short ones the raw
samples, and a bucket's mean is the mean of the samples in it."""

import pytest

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.store import open_store, series
from gpuwhy.store.rollups import DONE_MARK, MINUTE_NS, get_mark, roll_up

from .conftest import build


@pytest.fixture
def rolled(tmp_path):
    """The scenario with every finished minute rolled up, as the service's writer does."""
    scenario = build(tmp_path)
    db = open_store(scenario.path)
    while roll_up(db, scenario.at(10_000), max_minutes=600):
        pass
    yield scenario, db
    db.close()


def test_window_never_exceeds_the_point_budget():
    for seconds in series.RANGES.values():
        w = series.window(10**18, seconds, 720)
        assert -(-(w.until - w.since) // w.bucket_ns) <= 720
        assert w.bucket_ns >= NS_PER_SECOND


def test_long_ranges_read_rollups_and_agree_with_raw_means(rolled):
    scenario, db = rolled
    gpu = scenario.gpu_ids[1]
    done = get_mark(db, DONE_MARK)
    assert done is not None and done > scenario.t0
    # 24 h in 720 points: 120 s buckets, from the rollups up to the mark
    w = series.window(done, series.RANGES["24h"], 720)
    data = series.gpu_series(db, gpu, w)
    assert data["bucket_s"] == 120 and data["from_rollups"] > 0
    util = data["fields"].index("gpu_util") + 1
    for row in data["rows"]:
        bucket = (row[0] - w.since) // w.bucket_ns
        start = w.since + bucket * w.bucket_ns
        raw = [r[0] for r in db.execute(
            "select gpu_util from gpu_samples where gpu_id = ? and ts >= ? and ts < ?",
            [gpu, start, min(start + w.bucket_ns, done)])]
        assert row[util] == pytest.approx(sum(raw) / len(raw), abs=0.5)   # whole-% rollups


def test_raw_tail_after_the_last_rolled_minute_is_kept(rolled):
    scenario, db = rolled
    gpu = scenario.gpu_ids[1]
    db.execute("update store_state set value = ? where name = ?",
               [get_mark(db, DONE_MARK) - 3 * MINUTE_NS, DONE_MARK])
    w = series.window(scenario.at(700), series.RANGES["6h"], 720)     # 30 s buckets
    last = series.gpu_series(db, gpu, w)["rows"][-1][0]
    newest = db.execute("select max(ts) from gpu_samples where gpu_id = ?", [gpu]).fetchone()[0]
    assert newest - last < 30 * NS_PER_SECOND


def test_clock_reasons_are_ored_not_averaged(rolled):
    scenario, db = rolled
    gpu = scenario.gpu_ids[0]
    first, second = [r[0] for r in db.execute(
        "select ts from gpu_samples where gpu_id = ? order by ts limit 2", [gpu])]
    for ts, reasons in ((first, 0x4), (second, 0x20)):
        db.execute("update gpu_sample_data set clocks_event_reasons = ? where ts = ? and "
                   "gpu = (select gpu_key from gpus where id = ?)", [reasons, ts, gpu])
    w = series.window(first + 50 * NS_PER_SECOND, 0, 1, since=first)   # one 50 s bucket
    [row] = series.gpu_series(db, gpu, w)["rows"]
    assert row[-1] == 0x24


def test_a_process_series_averages_its_cuda_figures_per_bucket(tmp_path):
    from gpuwhy.identity import ProcessKey

    db = open_store(tmp_path / "p.db")
    key, base = ProcessKey(4242, 1000), 1_800_000_000
    db["process_seconds"].insert_all(
        [{"pid": key.pid, "start_time": key.start_time, "second": base + s, "on_cpu_ms": 900.0,
          "cuda_launches": 1000 * (s + 1), "cuda_sync_ms": 100.0 * s} for s in range(4)])
    w = series.window((base + 4) * NS_PER_SECOND, 0, 1, since=base * NS_PER_SECOND)
    data = series.process_series(db, key, w)
    assert data["rows"] == [[base * NS_PER_SECOND, None, 900.0, *[None] * 8, 2500.0, 150.0]]
    assert data["fields"][-2:] == ["cuda_launches", "cuda_sync_ms"]
    db.close()
