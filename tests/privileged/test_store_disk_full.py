"""A full disk under the store: the correlator holds events, says so, the sources keep
running; when space returns it writes what it held and goes on. On a real small tmpfs."""

import errno
import logging
import subprocess
import threading
import time

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.probes.gpu.runner import run_gpu_source
from gpuwhy.store import open_store

pytestmark = pytest.mark.root


@pytest.fixture
def small_fs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(path):
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with open(path, "ab", buffering=0) as filler:   # the last few bytes too
        try:
            while True:
                filler.write(b"\0" * 512)
        except OSError:
            pass


def _store_part(config):
    from gpuwhy.app.status import collect_status

    return next(p for p in collect_status(config)["parts"] if p["part"] == "store")


def _wait(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_full_disk_holds_events_reports_and_resumes(small_fs, tmp_config, caplog):
    config = tmp_config.replace({"store.path": str(small_fs / "gpuwhy.db"), "gpu.source": "sim",
                                 "gpu.interval": 0.1, "gpu.sim_gpus": 2})
    db = open_store(config["store.path"])
    subscriber = Subscriber(config["bus.endpoint"])
    correlator = Correlator(config, db, subscriber)
    stop = threading.Event()
    source = threading.Thread(target=run_gpu_source, args=(config, stop))
    writer = threading.Thread(target=correlator.run, args=(stop,))
    writer.start()
    source.start()
    reader = open_store(config["store.path"], readonly=True)

    def stored():
        return reader.execute("SELECT count(*) FROM gpu_sample_data").fetchone()[0]
    try:
        _wait(lambda: stored() >= 10, 20, "the first samples")
        with caplog.at_level(logging.WARNING, logger="gpuwhy.correlator.pipeline"):
            _fill(small_fs / "filler")
            _wait(lambda: correlator.store_error is not None, 30, "the store to fail")
            assert "full" in correlator.store_error
            assert "cannot write the store, holding events" in caplog.text
            held = len(correlator.pending)
            store = _store_part(config)      # read live: the stored row cannot be updated
            assert store["state"] == "failed", store
            assert store["detail"].startswith("disk full: 0.0 MB free"), store
            time.sleep(1.5)
            assert source.is_alive() and writer.is_alive()
            assert len(correlator.pending) > held         # still receiving, holding
            frozen = stored()
            (small_fs / "filler").unlink()
            _wait(lambda: correlator.store_error is None and not correlator.pending, 30,
                  "the store to resume")
            assert "the store is writable again" in caplog.text
        _wait(lambda: stored() > frozen + 20, 20, "new samples after the outage")
        store = _store_part(config)
        assert store["state"] == "ok" and store["detail"].endswith("MB free on disk"), store
    finally:
        stop.set()
        writer.join(10)
        source.join(10)
        reader.close()
        subscriber.close()
    assert not writer.is_alive() and not source.is_alive()
    db = open_store(config["store.path"])
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert correlator.dropped_store_unavailable == 0
    for gpu_id in [r[0] for r in db.execute("SELECT id FROM gpus")]:
        times = [r[0] for r in db.execute("SELECT ts FROM gpu_samples WHERE gpu_id = ? "
                                          "ORDER BY ts", [gpu_id])]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert max(gaps) < 1e9, "samples were lost while the disk was full"
    state = db.execute("SELECT state FROM source_health WHERE source = 'correlator'"
                       ).fetchone()
    assert state == ("ok",)
    db.close()
