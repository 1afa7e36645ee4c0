"""The decide stage's once-a-second beat reads as much with a long history as with a short
one: its reads of incidents go through indexes, not over every incident ever kept."""

from __future__ import annotations

import itertools

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.correlator.incidents import IncidentBuilder
from gpuwhy.store import open_store

S = NS_PER_SECOND
T0 = 1_700_000_000 * S


def _beat_instructions(tmp_config, path, incidents: int) -> int:
    """SQLite VM instructions (in hundreds) of an empty decide, over a store holding
    ``incidents`` resolved stalls of as many exited processes, and one open Xid."""
    db = open_store(path)
    with db.conn:
        db.conn.executemany(
            "insert into processes (pid, start_time, comm, first_seen, last_seen, exited_at) "
            "values (?, ?, 'python', ?, ?, ?)",
            [(1000 + i, i, T0 + i * S, T0 + i * S, T0 + i * S + 5) for i in range(incidents)])
        db.conn.executemany(
            "insert into incidents (kind, severity, state, opened_at, last_seen, count, title, "
            "summary, dedup_key, gpu_id, pid, start_time, closed_at, resolution, settle_until) "
            "values ('process_stall', 'warning', 'resolved', ?, ?, 1, 't', 's', ?, 'GPU-a', ?, "
            "?, ?, 'recovered', ?)",
            [(T0 + i * S, T0 + i * S, f"stall:{i}", 1000 + i, i, T0 + i * S + 3,
              T0 + i * S + 9) for i in range(incidents)])
        db.execute("insert into incidents (kind, severity, state, opened_at, last_seen, count, "
                   "title, summary, dedup_key, gpu_id, settle_until) values ('xid', 'error', "
                   "'open', ?, ?, 1, 'Xid 79', 's', 'xid:79', 'GPU-a', ?)",
                   [T0 + incidents * S, T0 + incidents * S, T0 + (incidents + 60) * S])
    builder = IncidentBuilder(tmp_config)
    now = T0 + (incidents + 1) * S
    with db.atomic():
        builder.decide(db, [], now)         # the first: reads the driver's tables once
    count = itertools.count()
    db.conn.set_progress_handler(lambda: next(count) and 0, 100)
    for k in range(3):
        with db.atomic():
            builder.decide(db, [], now + k * S)
    db.conn.set_progress_handler(None, 0)
    assert db.execute("select count(*) from incidents where state = 'open'").fetchone() == (1,)
    db.close()
    return next(count)


def test_an_empty_decide_does_not_read_more_for_a_longer_history(tmp_config, tmp_path):
    short = _beat_instructions(tmp_config, tmp_path / "short.db", 100)
    long = _beat_instructions(tmp_config, tmp_path / "long.db", 10_000)
    assert long < 2 * short + 50, (short, long)
