"""A process event is stored once: re-sent by a reconnecting probes process, published by a
second probes process, or found again by a restarted one's scan (store/writer.py, "process
events"); migration m102 removes the copies stored before it. Device opens and closes are
kept once too, in device_fds alone (m118 moves those stored as events rows there)."""

import collections
import sqlite3

from sqlite_utils import Database

from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    Envelope,
    GpuState,
    ProcessExec,
    ProcessExited,
    ProcessForked,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store, queries
from gpuwhy.store.migrations import migrations
from gpuwhy.store.writer import StoreWriter, _event_row

PARENT = ProcessKey(100, 1000)
CHILD = ProcessKey(4242, 987654)
PROCESS_KINDS = ("process_forked", "process_exec", "process_exited", "device_opened",
                 "device_closed")
FD_KINDS = ("device_opened", "device_closed")


def _life(ts=0, src="probes"):
    """One process's events as a probes process publishes them; ``ts`` shifts every time, as
    a second probes process's own clock reading of the same kernel events would."""
    events = [
        ProcessForked(ts=10 + ts, parent=PARENT, child=CHILD),
        ProcessExec(ts=11 + ts, process=CHILD, filename="/usr/bin/python3", ppid=100),
        DeviceOpened(ts=12, process=CHILD, fd=3, path="/dev/nvidiactl", device="nvidiactl"),
        DeviceClosed(ts=13, process=CHILD, fd=3, path="/dev/nvidiactl"),
        ProcessExited(ts=14 + ts, process=CHILD, exit_code=0),
    ]
    return [Envelope(src, i, e) for i, e in enumerate(events, start=1)]


def _counts(db):
    """How many of each kind the process's event list (the read API) shows."""
    return dict(collections.Counter(e["what"] for e in queries.process_events(db, CHILD)))


ONCE_EACH = dict.fromkeys(PROCESS_KINDS, 1)
LOST = GpuState(ts=16, gpu_id="GPU-1", state="lost", source="sim", simulated=True)


def test_a_process_event_written_twice_is_stored_once(db):
    writer = StoreWriter(db)
    writer.write_batch(_life())
    writer.write_batch(_life())              # in another batch
    writer.write_batch(_life() + _life())    # twice within one batch (held rows)
    for envelope in _life():                 # one by one (the writer's fallback path)
        writer.apply(envelope)
    assert _counts(db) == ONCE_EACH
    assert db.execute("select ts from events where kind = 'process_exec'").fetchall() == [(11,)]
    # one home for an open and its close
    assert db.execute("select kind from events where kind in (?, ?)", FD_KINDS).fetchall() == []
    assert db.execute("select fd, opened_at, closed_at from device_fds").fetchall() == \
        [(3, 12, 13)]


def test_a_second_probes_process_copies_are_stored_once(db):
    # an orphaned probes process and the new one see the same kernel events, each at its own
    # clock reading: fork, exec and exit are told apart by what they are, not by their time
    writer = StoreWriter(db)
    writer.write_batch(_life(ts=0) + _life(ts=3, src="probes-orphan"))
    counts = _counts(db)
    assert {k: counts[k] for k in ("process_forked", "process_exec", "process_exited")} == \
        {"process_forked": 1, "process_exec": 1, "process_exited": 1}


def test_distinct_events_of_one_process_are_all_kept(db):
    writer = StoreWriter(db)
    writer.write_batch([
        Envelope("probes", 1, ProcessExec(ts=11, process=CHILD, filename="/bin/sh")),
        Envelope("probes", 2, ProcessExec(ts=12, process=CHILD, filename="/usr/bin/python3")),
        Envelope("probes", 3, DeviceOpened(ts=13, process=CHILD, fd=3, path="/dev/nvidiactl",
                                           device="nvidiactl")),
        Envelope("probes", 4, DeviceClosed(ts=14, process=CHILD, fd=3, path="/dev/nvidiactl")),
        Envelope("probes", 5, DeviceOpened(ts=15, process=CHILD, fd=3, path="/dev/nvidiactl",
                                           device="nvidiactl")),
        # events that are not a process's: untouched by the key
        Envelope("gpu", 1, LOST),
        Envelope("gpu", 2, LOST),
    ])
    assert _counts(db) == {"process_exec": 2, "device_opened": 2, "device_closed": 1}
    assert db.execute("select count(*) from events where kind = 'gpu_state'").fetchone() == (2,)
    assert db.execute("select count(*) from events where dedup_key is null").fetchone() == (2,)


def test_a_restarted_probes_scan_of_an_fd_held_open_is_the_same_open(db):
    writer = StoreWriter(db)
    opened = DeviceOpened(ts=12, process=CHILD, fd=3, path="/dev/nvidia0", device="nvidiaN",
                          minor=0)
    writer.write_batch([Envelope("probes", 1, opened)])
    rescan = DeviceOpened(ts=50, process=CHILD, fd=3, path="/dev/nvidia0", device="nvidiaN",
                          minor=0, how="scan")
    writer.write_batch([Envelope("probes", 1, rescan)])
    assert _counts(db) == {"device_opened": 1}
    assert db.execute("select opened_at, how from device_fds").fetchall() == [(12, "open")]
    assert db.execute("select count(*) from gpu_bindings").fetchone() == (1,)
    # closed in between: a scan finding it open again is a new open
    writer.write_batch([
        Envelope("probes", 2, DeviceClosed(ts=60, process=CHILD, fd=3, path="/dev/nvidia0")),
        Envelope("probes", 3, DeviceOpened(ts=70, process=CHILD, fd=3, path="/dev/nvidia0",
                                           device="nvidiaN", minor=0, how="scan"))])
    assert _counts(db) == {"device_opened": 2, "device_closed": 1}
    assert db.execute("select opened_at, closed_at from device_fds order by opened_at"
                      ).fetchall() == [(12, 60), (70, None)]


def test_the_migration_removes_stored_copies_and_keys_the_rest_as_the_writer_does(tmp_path):
    path = tmp_path / "old.db"
    old = Database(sqlite3.connect(path))
    migrations.apply(old, stop_before="m102_process_events_once")
    assert "dedup_key" not in old["events"].columns_dict
    # what the writer stored before: every copy a row (an orphan's, a resync's)
    envelopes = _life() + _life(ts=3, src="probes-orphan") + _life()
    envelopes.append(Envelope("probes", 9, ProcessExec(ts=30, process=CHILD,
                                                       filename="/bin/sh")))
    envelopes += [Envelope("gpu", 1, LOST)] * 2
    rows = []
    for envelope in envelopes:
        row = _event_row(envelope)
        if isinstance(envelope.event, ProcessForked):
            row.update(pid=CHILD.pid, start_time=CHILD.start_time)
        rows.append(row)
    old["events"].insert_all(rows)
    first_ids = {kind: first for kind, first in old.execute(
        "select kind, min(id) from events group by kind")}
    old.close()

    db = open_store(path)
    assert not migrations.pending(db)
    assert _counts(db) == {**ONCE_EACH, "process_exec": 2}
    kept = dict(db.execute("select kind, min(id) from events group by kind"))
    # the first copy of each is the one kept; opens and closes moved to device_fds (m118)
    assert kept == {kind: first for kind, first in first_ids.items() if kind not in FD_KINDS}
    assert db.execute("select fd, opened_at, closed_at, path, device, how, scanned, cloexec "
                      "from device_fds").fetchall() == \
        [(3, 12, 13, "/dev/nvidiactl", "nvidiactl", "open", 0, 0)]
    assert db.execute("select count(*) from events where kind = 'gpu_state'").fetchone() == (2,)
    # the keys it wrote are the writer's: the same events again add nothing
    before = db["events"].count
    StoreWriter(db).write_batch(_life() + [envelopes[-3]])
    assert db["events"].count == before
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    db.close()
