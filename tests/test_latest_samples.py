"""The latest sample of each GPU (what /metrics and the OTLP export read every time) is found
in the messy states a host's store is in, reading a bounded range of the samples' key."""

from __future__ import annotations

from gpuwhy.app.demo.synthetic_store import BUDGET_FIELDS, Plan, fill
from gpuwhy.store import open_store, rollups
from gpuwhy.store.queries import LATEST_SPAN_NS, latest_gpu_samples

MINUTE = 60 * 10**9


def test_each_gpus_latest_sample_in_a_messy_store(tmp_path):
    db = open_store(tmp_path / "gpuwhy.db")
    fill(db, Plan(gpus=4, days=0.01, fields=BUDGET_FIELDS))      # 864 s of 4 GPUs
    newest = db.execute("select max(ts) from gpu_sample_data").fetchone()[0]
    keys = dict(db.execute("select gpu_key, id from gpus").fetchall())
    # GPU 2: its source stopped 10 minutes ago (rolled up); GPU 3: 3 minutes ago, before
    # any rollup was made of those minutes; and a GPU known only from the kernel log
    db.execute("delete from gpu_sample_data where gpu = 2 and ts > ?", [newest - 10 * MINUTE])
    db.execute("delete from gpu_sample_data where gpu = 3 and ts > ?", [newest - 3 * MINUTE])
    db["gpus"].insert({"id": "GPU-from-the-kernel-log", "uuid": "GPU-from-the-kernel-log"})
    rollups.roll_up(db, newest - 7 * MINUTE, max_minutes=100)    # trailing by 7 minutes
    assert rollups.get_mark(db, rollups.DONE_MARK) < newest - 3 * MINUTE
    expected = dict(db.execute("select g.id, max(d.ts) from gpu_sample_data d join gpus g "
                               "on g.gpu_key = d.gpu group by d.gpu").fetchall())
    got = {row[0]: row for row in latest_gpu_samples(db, ["gpu_util", "power_w"])}
    assert set(got) == set(keys.values())          # every sampled GPU, and no other
    assert {gpu: row[1] for gpu, row in got.items()} == expected
    assert expected[keys[2]] <= newest - 10 * MINUTE < newest - LATEST_SPAN_NS
    whole = dict(db.execute("select gpu_id || ts, gpu_util from gpu_samples").fetchall())
    assert all(whole[row[0] + str(row[1])] == row[2] for row in got.values())


def test_an_empty_store_has_no_latest_samples(tmp_path):
    assert latest_gpu_samples(open_store(tmp_path / "gpuwhy.db"), ["gpu_util"]) == []
