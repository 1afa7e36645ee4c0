"""The stall check's latest busy sample: as the store would find it, without scanning it."""

from __future__ import annotations

import itertools

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.correlator.incidents import IncidentBuilder
from gpuwhy.events import Envelope, GpuSample
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

S = NS_PER_SECOND
T0 = 1_700_000_000 * S
GPUS = ("GPU-a", "GPU-b", "GPU-c")
# the store's query the check made for every bound process, twice a second
STORE_QUERY = ("select max(ts) from gpu_samples where gpu_id = ? and gpu_util > ? and "
               "ts between ? and ?")


def _util(gpu: str, second: int) -> float:
    """Realistic shapes: a, busy with idle dips and a long idle tail; b, idle but for one
    busy stretch; c, never busy. Values sit around the 5 % threshold too (5.4 is stored 5)."""
    if gpu == "GPU-a":
        return 2.0 if second % 17 in (3, 4) or second > 140 else 63.5
    if gpu == "GPU-b":
        return 71.0 if 40 <= second < 55 else (5.4 if second % 5 == 0 else 0.0)
    return 4.9


def _samples(seconds: range, shuffled: bool = False) -> list[Envelope]:
    events = [GpuSample(ts=T0 + s * S, gpu_id=gpu, source="sim", simulated=True,
                        fields={"gpu_util": _util(gpu, s), "sm_active": 0.3}, instance=inst)
              for s in seconds for gpu in GPUS for inst in ("", "1") if inst == "" or s % 3]
    if shuffled:       # a late source: samples come out of order within a batch
        events = events[1::2] + events[::2]
    seq = itertools.count()
    return [Envelope("sim", next(seq), e) for e in events]


def _feed(db, builder: IncidentBuilder, envelopes: list[Envelope], size: int = 40) -> None:
    writer = StoreWriter(db)
    for first in range(0, len(envelopes), size):
        batch = envelopes[first:first + size]
        with db.atomic():
            writer.write_batch(batch)
            builder.decide(db, batch)


def test_the_latest_busy_sample_is_the_one_the_store_query_finds(tmp_config, tmp_path):
    db = open_store(tmp_path / "busy.db")
    threshold = float(tmp_config["correlator.stall_util_pct"])
    _feed(db, IncidentBuilder(tmp_config), _samples(range(0, 90)))      # a first service
    builder = IncidentBuilder(tmp_config)                               # restarted
    _feed(db, builder, _samples(range(90, 200), shuffled=True))
    asked = 0
    for now_s in (120, 160, 199):
        now = T0 + now_s * S
        for gpu in GPUS:
            for since_s in (0, 10, 45, 60, 100, 150, 199):
                since = T0 + since_s * S
                expected = db.execute(STORE_QUERY, [gpu, threshold, since, now]).fetchone()[0]
                assert builder.last_busy.latest(db, gpu, since, now) == expected, \
                    (gpu, since_s, now_s)
                asked += 1
    assert asked == 63
    db.close()


def test_a_stall_check_does_not_read_more_for_a_longer_history(tmp_config, tmp_path):
    """The check's SQLite work is counted in VM instructions (a progress handler): with
    ten times the history behind the same bound processes, one GPU idle for half of it
    (the store's newest-first search for its last busy sample went through all of that
    idle half, twice a second for each of its processes), about the same."""
    def instructions(hours: float) -> int:
        db = open_store(tmp_path / f"{hours}.db")
        seconds = int(hours * 3600)
        builder = IncidentBuilder(tmp_config)
        rows = []
        for gpu in GPUS:
            db.execute("insert into gpus (id, first_seen, last_seen) values (?, ?, ?)",
                       [gpu, T0, T0])
        keys = dict(db.execute("select id, gpu_key from gpus").fetchall())
        for second in range(seconds):
            for gpu in GPUS:      # GPU-a idle for the second half: its process stalled
                idle = gpu == "GPU-a" and second > seconds // 2
                rows.append((T0 + second * S, keys[gpu], 2 if idle else 60))
        db.conn.executemany("insert into gpu_sample_data (ts, gpu, gpu_util) values (?, ?, ?)",
                            rows)
        for n, gpu in enumerate(GPUS * 2):
            db.execute("insert into processes (pid, start_time, comm, cmdline, first_seen, "
                       "last_seen) values (?, 5, 'python', 'python train.py', ?, ?)",
                       [100 + n, T0, T0])
            db.execute("insert into gpu_bindings (pid, start_time, gpu_id, since, evidence) "
                       "values (?, 5, ?, ?, 'holds /dev/nvidia0')", [100 + n, gpu, T0])
        db.conn.commit()
        now = T0 + (seconds - 1) * S
        builder._stalls(db, now)               # the first check reads what came before it
        count = itertools.count()
        db.conn.set_progress_handler(lambda: next(count) and 0, 100)
        for _ in range(3):
            builder._stalls(db, now)
        db.conn.set_progress_handler(None, 0)
        db.close()
        return next(count)

    short, long = instructions(0.5), instructions(5)
    assert long < 2 * short + 50, (short, long)
    assert short < 200, short      # a few indexed reads a process, not a scan


def test_a_stall_check_reads_once_a_gpu_not_once_a_process(tmp_config, tmp_path):
    """Processes that share a GPU share its answer: a check reads the GPU's samples and
    state once, and the active stalls once, whatever the number of processes bound to it
    (it made three reads a process, twice a second). Counted in statements run."""
    def statements(processes: int, idle_s: int) -> int:
        db = open_store(tmp_path / f"{processes}-{idle_s}.db")
        builder = IncidentBuilder(tmp_config)
        envelopes = [Envelope("sim", second, GpuSample(
            ts=T0 + second * S, gpu_id="GPU-a", source="sim", simulated=True,
            fields={"gpu_util": 2.0 if second >= 120 - idle_s else 70.0}))
            for second in range(120)]
        _feed(db, builder, envelopes)
        for n in range(processes):
            db.execute("insert into processes (pid, start_time, comm, cmdline, first_seen, "
                       "last_seen) values (?, 5, 'python', 'python train.py', ?, ?)",
                       [100 + n, T0, T0])
            db.execute("insert into gpu_bindings (pid, start_time, gpu_id, since, evidence) "
                       "values (?, 5, 'GPU-a', ?, 'holds /dev/nvidia0')", [100 + n, T0])
        db.conn.commit()
        now = T0 + 119 * S
        builder._stalls(db, now)               # the first check reads what came before it
        run = []
        db.conn.set_trace_callback(run.append)
        found = builder._stalls(db, now)
        db.conn.set_trace_callback(None)
        assert found == []                     # busy, or not idle for stall_seconds yet
        db.close()
        return len(run)

    busy, idle = statements(1, 0), statements(1, 5)       # idle 5 s: not a stall yet
    assert statements(8, 0) == busy and statements(8, 5) == idle, (busy, idle)
    assert busy <= 4 and idle <= 4, (busy, idle)     # bindings, stalls, samples, state
