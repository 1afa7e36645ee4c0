"""Crash safety: a writer killed with SIGKILL mid-write loses at most its last batch and
never corrupts the store; readers do not block the writer (WAL)."""

import os
import random
import signal
import subprocess
import sys
import time

from gpuwhy.events import Envelope, GpuSample
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

BATCH = 200
WRITER = f"""
import sys
from gpuwhy.events import Envelope, GpuSample
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

db = open_store(sys.argv[1])
writer = StoreWriter(db)
seq = db.execute("SELECT count(*) FROM gpu_sample_data").fetchone()[0]
while True:
    batch = [Envelope("crash", seq + i, GpuSample(
        ts=1_767_225_600_000_000_000 + (seq + i) * 1000, gpu_id=f"GPU-{{(seq + i) % 8}}",
        source="sim", simulated=True,
        fields={{"gpu_util": float(i % 100), "power_w": 300.5, "sm_active": 0.5}}))
        for i in range({BATCH})]
    writer.write_batch(batch)
    seq += {BATCH}
    print(seq, flush=True)
"""


def _run_and_kill(path, rng):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    committed = 0
    try:
        for _ in range(rng.randint(2, 12)):
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
            committed = int(line)
        time.sleep(rng.uniform(0, 0.05))          # somewhere inside a later batch
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        rest = proc.stdout.read().split()
        proc.stdout.close()
    return int(rest[-1]) if rest else committed


def test_kill_9_loses_at_most_the_last_batch_and_never_corrupts(tmp_path):
    path = tmp_path / "crash.db"
    rng = random.Random(8)
    for _ in range(6):
        last_reported = _run_and_kill(path, rng)
        db = open_store(path)
        try:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            count = db.execute("SELECT count(*) FROM gpu_sample_data").fetchone()[0]
        finally:
            db.close()
        # every reported batch is there; at most the one being written when killed is not
        # reported yet (or committed but not reported); never part of a batch
        assert count % BATCH == 0
        assert last_reported <= count <= last_reported + BATCH


def test_a_reader_in_a_long_read_does_not_block_the_writer(tmp_path):
    path = tmp_path / "wal.db"
    db = open_store(path)
    writer = StoreWriter(db)

    def batch(start):
        return [Envelope("t", i, GpuSample(ts=start + i, gpu_id="GPU-0", source="sim",
                                           simulated=True, fields={"gpu_util": 1.0}))
                for i in range(100)]
    writer.write_batch(batch(0))
    reader = open_store(path, readonly=True)
    reader.conn.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone() == (100,)
    started = time.monotonic()
    writer.write_batch(batch(1000))                 # would wait 5 s on a lock without WAL
    assert time.monotonic() - started < 2
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone() == (100,)  # snapshot
    reader.conn.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone() == (200,)
    reader.close()
    db.close()
