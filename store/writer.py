"""Apply bus events to the store, in batches, from the one writer (the correlator)."""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Iterable

from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.events import (
    CronExecution,
    CronSchedule,
    CudaCall,
    CudaLibrary,
    CudaStats,
    DeviceClosed,
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    EngineSample,
    Envelope,
    Event,
    GpuProcesses,
    GpuSample,
    GpuSeen,
    GpuState,
    GpuXid,
    KernelLogCheckpoint,
    KernelLogRecord,
    ProcessExec,
    ProcessExited,
    ProcessForked,
    ProcessSeen,
    PythonStacks,
    RuleFinding,
    SchedStats,
    SourceHealth,
    event_fields,
    methods_by_kind,
)
from gpuwhy.identity import GpuIdentity, ProcessKey, using_gpu_minor
from gpuwhy.pystacks import clean_rows
from gpuwhy.store.gpu_identity import note_pci_uuid, resolve_gpu
from gpuwhy.store.held import HeldRows
from gpuwhy.store.samples import encode_fields
from gpuwhy.wire import json_text

_NOT_IN_BODY = ("ts", "raw_ts", "process")     # columns of their own
# engine_samples columns that are not values: a sender's value of that name is not taken
_ENGINE_SAMPLE_KEYS = frozenset({"id", "ts", "engine", "endpoint", "pid", "start_time",
                                 "version", "gpu_ids"})


def _event_row(envelope: Envelope, gpu_id: str | None = None) -> dict:
    """The ``events`` row of an event, its columns in _EVENT_COLUMNS' order."""
    event = envelope.event
    process = getattr(event, "process", None)
    return {"ts": event.ts, "topic": event.topic, "kind": event.kind, "src": envelope.src,
            "pid": process.pid if process else None,
            "start_time": process.start_time if process else None,
            "body": json_text(event_fields(event, _NOT_IN_BODY)), "gpu_id": gpu_id}


# --- process events: stored once ---
# A process event is published again when a probes process re-sends its state to a
# reconnecting service (fdtrack's resync), and twice when two probes processes watch the
# same host (one left behind by a killed service). The events table keeps one row per
# (kind, pid, start_time, dedup_key): its partial unique index (migration
# m102_process_events_once, which writes these same keys into the rows it found) makes a
# second copy an ignored insert. The key tells an event from the other events of its kind
# of the same process: a process is forked once and exits once; it may exec more than once,
# another file each time (a process that execs the same file again keeps one row: its first
# exec). Device opens and closes are not events rows (since m118): device_fds is their one
# home, its key (pid, start_time, fd, opened_at) keeps an open once (a resync re-sends an
# open with its time; a restarted probes process's scan, which cannot know it, is matched in
# _on_device_opened), and a close is the open's closed_at.
def exec_dedup_key(event: ProcessExec) -> str:
    return event.filename


ONCE_PER_PROCESS = ""      # process_forked (the child's row), process_exited


log = logging.getLogger(__name__)
# Tables whose rows _insert and _upsert hold until the end of the batch (store/held.py).
_HELD_TABLES = frozenset({"events", "sched_stats", "driver_calls"})
_DRIVER_CALL_STATS_PK = ("pid", "start_time", "path", "cmd", "sub")
_JSON_TYPES = (dict, list, tuple)    # stored as JSON text
# ProcessSeen's values for "not read": a bare sighting must not blank stored facts.
UNKNOWN_PROCESS_FACT = {"ppid": (0, None), "uid": (-1, None)}
_SEEN_FACTS = ("comm", "cmdline", "exe", "ppid", "uid", "cgroup", "tag", "container_id",
               "pod_uid", "unit", "started_at", "env")
# A sighting's row: a process seen again keeps its first sighting, and each fact it knew
# where this sighting's is unknown (UNKNOWN_PROCESS_FACT, else "" or NULL).
_SEEN = (
    f"insert into processes (pid, start_time, {', '.join(_SEEN_FACTS)}, first_seen, last_seen) "
    f"values ({', '.join('?' * (len(_SEEN_FACTS) + 4))}) on conflict (pid, start_time) do "
    "update set " + ", ".join(
        f"{name} = coalesce(nullif(excluded.{name}, "
        f"{UNKNOWN_PROCESS_FACT.get(name, ('',))[0]!r}), {name})" for name in _SEEN_FACTS)
    + ", last_seen = excluded.last_seen")


@functools.lru_cache(maxsize=512)
def _statement(table: str, columns: tuple[str, ...], verb: str,
               pk: tuple[str, ...] = ()) -> str:
    """Insert SQL for these columns; with ``pk``, an upsert of the columns given."""
    names = ", ".join(f"[{c}]" for c in columns)
    sql = f"{verb} into [{table}] ({names}) values ({', '.join('?' * len(columns))})"
    if pk:
        updates = ", ".join(f"[{c}] = excluded.[{c}]" for c in columns if c not in pk)
        sql += f" on conflict ({', '.join(pk)}) do " + \
            (f"update set {updates}" if updates else "nothing")
    return sql


_DEVICE_FD_COLUMNS = ("pid", "start_time", "fd", "opened_at", "path", "device", "minor", "how",
                      "scanned", "cloexec")
_OPEN_FD = _statement("device_fds", _DEVICE_FD_COLUMNS, "insert",
                      ("pid", "start_time", "fd", "opened_at"))
# A close (and a process's exit) ends the opens of that fd (of any fd) made before it: held
# after the batch's opens (HeldRows.add_after), so that a late open that came after its
# close is not left open. The closes of single fds run before the exits (after_order): an
# fd closed before its process exited keeps its own close time.
_CLOSE_FD = ("update device_fds set closed_at = ? where pid = ? and start_time = ? and fd = ? "
             "and closed_at is null and opened_at <= ?")
_CLOSE_PROCESS_FDS = ("update device_fds set closed_at = ? where pid = ? and start_time = ? "
                      "and closed_at is null and opened_at <= ?")
_SET_EXE_FILENAME = "update processes set exe_filename = ? where pid = ? and start_time = ?"
_SET_EXITED = ("update processes set exited_at = ?, last_seen = ?, exit_code = "
               "coalesce(?, exit_code), signal = coalesce(?, signal) where pid = ? and "
               "start_time = ?")
_END_BINDINGS = ("update gpu_bindings set until = ? where pid = ? and start_time = ? and "
                 "until is null")
_DRIVER_CALL_STATS_COLUMNS = ("pid", "start_time", "path", "device", "cmd", "sub", "op",
                              "sub_name", "count", "errors", "latency_sum_ns",
                              "latency_max_ns", "bytes", "latency_log2", "updated_at")
_WRITE_DRIVER_CALL_STATS = _statement("driver_call_stats", _DRIVER_CALL_STATS_COLUMNS, "insert",
                                      _DRIVER_CALL_STATS_PK)
_SCHED_KEY_COLUMNS = ("pid", "start_time", "ts", "interval_ns", "worker_processes",
                      "node_on_cpu_ns")
# SchedStats' figures, column prefixes
_SCHED_SIDES = ("own", "workers", "frontend", "engine_loop")
_KERNEL_LOG_COLUMNS = ("cursor", "ts", "raw_ts", "boot_id", "origin", "kind", "xid", "sxid",
                       "pci", "gpu_id", "pid", "name", "gpu_instance", "compute_instance",
                       "message", "details", "line", "driver_version")
_INSERT_KERNEL_LOG = _statement("kernel_log", _KERNEL_LOG_COLUMNS, "insert")
_WRITE_CURSOR = _statement("source_cursors",
                           ("source", "origin", "cursor", "boot_id", "updated_at"), "insert",
                           ("source",))
_EVENT_COLUMNS = ("ts", "topic", "kind", "src", "pid", "start_time", "body", "gpu_id")
_INSERT_EVENT = _statement("events", _EVENT_COLUMNS, "insert")
_INSERT_PROCESS_EVENT = _statement("events", (*_EVENT_COLUMNS, "dedup_key"), "insert or ignore")
# What SQLite raises for a value it cannot bind (a list or a dict where a number goes, from a
# buggy or hostile sender): the event's fault, not the store's, so the event is rejected like
# any bad one instead of failing the batch (and the next, and every one after) as a full disk
# would. Rows are bound as built: converting each value first cost a tenth of the writer.
_UNBINDABLE = (sqlite3.ProgrammingError, sqlite3.InterfaceError)
MAX_PROCESSES_REMEMBERED = 4096     # processes whose driver-call figures are remembered


class StoreWriter:
    """Turns events into rows. Idempotent: a re-sent snapshot changes nothing."""

    def __init__(self, db: Database):
        self.db = db
        self.rejected = 0
        # GPUs whose row this batch has written: their last_seen is raised once at the end
        # of the batch, not on every sample (a statement per sample cost an eighth of P4)
        self._gpus_seen: dict[str, int] = {}
        # gpus.gpu_key of the GPUs touched this batch (the sample rows' key); per batch only:
        # the decide stage may delete a GPU's row (gpu_identity.learn) and a new one gets a new key
        self._gpu_keys: dict[str, int | None] = {}
        # MIG instances sampled this batch: (gpu_id, instance) -> (profile, first ts, latest
        # ts), one gpu_instances statement at the end of the batch, as for _gpus_seen
        self._instances_seen: dict[tuple[str, str], tuple[str, int, int]] = {}
        # GPU of each device minor, and the open bindings, read or written this batch: a
        # SELECT for each device open and driver-call figure cost a fifth of their handling.
        # Per batch, as _gpu_keys: the decide stage may merge GPU rows between batches.
        self._minor_gpus: dict[int, str] = {}
        self._bound: set[tuple[int, int, str]] = set()
        self._klog_cursors: set[str] = set()     # kernel-log rows held this batch
        self._table_columns: dict[str, set[str]] = {}
        # sched_stats statements by the figures' names, by _SCHED_SIDES: see _sched_plan
        self._sched_plans: dict[tuple, tuple] = {}
        self._sample_sql: dict[tuple[str, ...], str] = {}    # by the sample's columns
        self._held = HeldRows(after_order=(_CLOSE_FD, _CLOSE_PROCESS_FDS))
        self._handlers = methods_by_kind(self, "_on_")
        # driver_call_stats figures already in the store, per process then (path, cmd, sub):
        # a flush re-sends a file's every operation when one moved, and rewriting the rest
        # was nine rows in ten of that table. ``_ops_batch`` holds this batch's until
        # ``committed()``; a failed batch forgets them, and they are written again.
        self._ops_stored: dict[tuple[int, int], dict[tuple, tuple]] = {}
        self._ops_batch: dict[tuple[int, int], dict[tuple, tuple]] = {}

    def write_batch(self, envelopes: Iterable[Envelope]) -> int:
        """Apply every envelope in one transaction; returns how many were applied.

        An event the store cannot take (a bug, a field of the wrong shape) is logged,
        counted in ``rejected`` and skipped, leaving nothing behind: the batch is rolled back
        and written again one event at a time, each in a savepoint (a savepoint per event
        all the time would cost a fifth of the writer). A database error (disk full, I/O)
        rolls back the whole batch and is raised. The hottest tables' rows are held and
        written at the end of the batch (``HeldRows``); one by one, at the end of each event.
        """
        envelopes = list(envelopes)
        conn = self.db.conn
        self._forget_gpus()
        try:
            with self.db.atomic():
                conn.execute("savepoint batch")     # plain SQL: sqlite-utils' costs ~20 µs
                one_by_one = not self._apply_all(envelopes)
                conn.execute("release batch")
                applied = self._write_one_by_one(envelopes) if one_by_one else len(envelopes)
                self._record_gpus_seen()
            return applied
        except BaseException:
            self.forget_uncommitted()
            raise
        finally:        # a rolled back batch leaves no rows held and no GPU keys it created
            self._held.clear()
            self._forget_gpus()

    def committed(self) -> None:
        """The transaction holding the batches written since the last call is committed."""
        for process, ops in self._ops_batch.items():
            self._ops_stored.setdefault(process, {}).update(ops)
        self._ops_batch.clear()
        if len(self._ops_stored) > MAX_PROCESSES_REMEMBERED:   # exits never seen: start over
            self._ops_stored.clear()

    def forget_uncommitted(self) -> None:
        """The batches written since ``committed()`` were rolled back."""
        self._ops_batch.clear()

    def _apply_all(self, envelopes: list[Envelope]) -> bool:
        """Apply the batch inside its savepoint; False (rolled back) when an event failed."""
        handlers = self._handlers
        try:
            for envelope in envelopes:          # _handle, without a call an event
                event = envelope.event
                handler = handlers.get(event.kind)
                if handler is not None:
                    handler(envelope, event)
            self._held.write(self.db.conn)     # a value SQLite refuses: found one by one
            return True
        except _UNBINDABLE:
            pass                               # an event's value, not the store: as below
        except sqlite3.Error:
            raise
        except Exception:  # noqa: BLE001 - found again, and logged, one by one
            pass
        self.db.conn.execute("rollback to batch")
        self._held.clear()
        self._forget_gpus()
        self._ops_batch.clear()
        return False

    def _forget_gpus(self) -> None:
        self._gpus_seen.clear()
        self._gpu_keys.clear()
        self._instances_seen.clear()
        self._minor_gpus.clear()
        self._bound.clear()
        self._klog_cursors.clear()

    def _record_gpus_seen(self) -> None:
        self.db.conn.executemany("update gpus set last_seen = max(last_seen, ?) where id = ?",
                                 [(ts, gpu_id) for gpu_id, ts in self._gpus_seen.items()])
        self._gpus_seen.clear()
        if self._instances_seen:
            self.db.conn.executemany(
                "insert into gpu_instances (gpu_id, instance, profile, first_seen, last_seen) "
                "values (?, ?, ?, ?, ?) on conflict(gpu_id, instance) do update set "
                "last_seen = max(last_seen, excluded.last_seen), profile = case when "
                "excluded.profile != '' then excluded.profile else profile end",
                [(gpu_id, instance, profile, first, last) for (gpu_id, instance),
                 (profile, first, last) in self._instances_seen.items()])
            self._instances_seen.clear()

    def _write_one_by_one(self, envelopes: list[Envelope]) -> int:
        applied = 0
        conn = self.db.conn
        for envelope in envelopes:
            conn.execute("savepoint event")
            try:
                self.apply(envelope)
            except _UNBINDABLE:              # a value of a type SQLite cannot store
                self._reject(envelope)
                continue
            except sqlite3.Error:
                raise
            except Exception:  # noqa: BLE001 - one bad event must not stop the writer
                self._reject(envelope)
                continue
            conn.execute("release event")
            applied += 1
        return applied

    def _reject(self, envelope: Envelope) -> None:
        """Undo the event being applied, count and log it (called while handling its error)."""
        self.db.conn.execute("rollback to event")
        self.db.conn.execute("release event")
        self._held.clear()            # its rows held when the handler failed
        self._forget_gpus()           # a GPU row (and key) it created is gone with it
        self._ops_batch.clear()       # which were its own is not known: all again
        self._ops_stored.clear()
        self.rejected += 1
        log.exception("store rejected a %s event from %s", envelope.event.kind, envelope.src)

    def apply(self, envelope: Envelope) -> None:
        """Apply one event, its rows written before this returns."""
        self._handle(envelope)
        self._held.write(self.db.conn)

    def _handle(self, envelope: Envelope) -> None:
        event: Event = envelope.event
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(envelope, event)

    def _on_process_seen(self, envelope: Envelope, event: ProcessSeen) -> None:
        # one statement: a later sighting that could not read /proc keeps what was known
        self.db.conn.execute(_SEEN, [
            event.process.pid, event.process.start_time, event.comm, event.cmdline, event.exe,
            event.ppid, event.uid, event.cgroup, event.tag, event.container_id, event.pod_uid,
            event.unit, event.started_at,
            # NULL when none is known: a sighting that could not read it keeps the stored one
            json_text(event.env) if event.env else None, event.ts, event.ts])

    def _on_process_exited(self, envelope: Envelope, event: ProcessExited) -> None:
        key = (event.process.pid, event.process.start_time)
        # held, with the batch's other exits: one statement each for all of them
        self._held.add_after(_SET_EXITED, [event.ts, event.ts, event.exit_code, event.signal,
                                           *key])
        self._held.add_after(_END_BINDINGS, [event.ts, *key])
        if self._bound:
            self._bound = {b for b in self._bound if b[:2] != key}
        self._held.add_after(_CLOSE_PROCESS_FDS, [event.ts, *key, event.ts])
        self._insert_process_event(_event_row(envelope), ONCE_PER_PROCESS)
        # its final figures came before its exit; a late one would only be written again
        self._ops_stored.pop(key, None)
        self._ops_batch.pop(key, None)

    def _on_device_opened(self, envelope: Envelope, event: DeviceOpened) -> None:
        key = {"pid": event.process.pid, "start_time": event.process.start_time}
        scanned = event.how in ("scan", "inherited")    # found by a start-up scan
        if scanned:
            self._held.write(self.db.conn)     # the fds this batch opened and closed, first
            if self.db.execute(
                    "select 1 from device_fds where pid = ? and start_time = ? and fd = ? and "
                    "path = ? and closed_at is null",
                    [key["pid"], key["start_time"], event.fd, event.path]).fetchone():
                # A restarted probes process's start-up scan found an fd the store holds
                # open: the open already stored, seen again (its time is the scan's, so the
                # events table's key cannot tell), not a second one.
                return
        self._held.add("device_fds", _OPEN_FD, [   # in _DEVICE_FD_COLUMNS' order
            key["pid"], key["start_time"], event.fd, event.ts, event.path, event.device,
            event.minor, event.how, int(scanned), int(event.cloexec)])
        if event.device == "nvidiaN" and event.minor is not None:
            gpu_id = self._gpu_for_minor(event.minor, event.ts)
            if using_gpu_minor(event) is not None:
                self._bind(event.process, gpu_id, event.ts, f"holds {event.path}")

    def _bind(self, process: ProcessKey, gpu_id: str, ts: int, evidence: str) -> None:
        key = (process.pid, process.start_time, gpu_id)
        if key in self._bound:
            return
        if not self.db.execute("select 1 from gpu_bindings where pid = ? and start_time = ? "
                               "and gpu_id = ? and until is null", key).fetchone():
            self._insert("gpu_bindings", {"pid": process.pid, "start_time": process.start_time,
                                          "gpu_id": gpu_id, "since": ts, "until": None,
                                          "evidence": evidence})
        self._bound.add(key)

    def _gpu_for_minor(self, minor: int, ts: int) -> str:
        gpu_id = self._minor_gpus.get(minor)
        if gpu_id is not None:
            return gpu_id
        weak = GpuIdentity(minor=minor).id
        row = self.db.execute("select id from gpus where minor = ?", [minor]).fetchone()
        # No GPU row holds the minor, but the driver's table may have named its GPU (a
        # driver_gpu event learned "minor:N" as an alias): bind to that GPU, not to a row
        # of its own
        gpu_id = row[0] if row else resolve_gpu(self.db, minor=minor) or weak
        if gpu_id == weak:
            self.db.table("gpus").insert({"id": gpu_id, "minor": minor, "first_seen": ts,
                                    "last_seen": ts}, ignore=True)
        self._minor_gpus[minor] = gpu_id
        return gpu_id

    def _on_device_closed(self, envelope: Envelope, event: DeviceClosed) -> None:
        self._held.add_after(_CLOSE_FD, [event.ts, event.process.pid, event.process.start_time,
                                         event.fd, event.ts])

    # --- probes handlers ---
    def _on_driver_call_stats(self, envelope: Envelope, event: DriverCallStats) -> None:
        pid, start_time, path = event.process.pid, event.process.start_time, event.path
        minor = using_gpu_minor(event)
        if minor is not None:
            self._bind(event.process, self._gpu_for_minor(minor, event.ts), event.ts,
                       f"calls the driver on {event.path}")
        # Cumulative figures, every column set: the last row per key in a batch is the one
        # the per-event upserts would end with. An operation whose figures are those already
        # written is left as it is (its updated_at: when it last moved).
        process = (pid, start_time)
        batch = self._ops_batch.setdefault(process, {})
        stored = self._ops_stored.get(process, {})
        for op in event.ops:
            cmd, sub = op["cmd"], op["sub"]
            which = (path, cmd, sub)
            figures = (op["count"], op["errors"], op["latency_sum_ns"], op["bytes"])
            if batch.get(which, stored.get(which)) == figures:
                continue
            batch[which] = figures
            self._held.add_latest(     # in _DRIVER_CALL_STATS_COLUMNS' order
                ("driver_call_stats", pid, start_time, path, cmd, sub), _WRITE_DRIVER_CALL_STATS,
                [pid, start_time, path, event.device, cmd, sub, op["op"], op["sub_name"],
                 op["count"], op["errors"], op["latency_sum_ns"], op["latency_max_ns"],
                 op["bytes"], json_text(op["latency_log2"]), event.ts])

    def _on_driver_call(self, envelope: Envelope, event: DriverCall) -> None:
        row = {k: v for k, v in vars(event).items() if k not in ("process", "raw_ts")}
        row.update(pid=event.process.pid, start_time=event.process.start_time,
                   gpu_ids=json_text(event.gpu_ids) if event.gpu_ids is not None else None,
                   reasons=",".join(event.reasons))
        self._insert("driver_calls", row)

    def _on_sched_stats(self, envelope: Envelope, event: SchedStats) -> None:
        # frontend, engine_loop: absent from recordings made before them (None: their
        # columns stay NULL)
        sides = (event.own, event.workers, event.frontend or {}, event.engine_loop or {})
        shape = tuple(tuple(figures) for figures in sides)
        plan = self._sched_plans.get(shape) or self._sched_plan(shape)
        sql, *kept = plan
        self._held.add("sched_stats", sql, [
            event.process.pid, event.process.start_time, event.ts, event.interval_ns,
            event.worker_processes,
            json_text(event.node_on_cpu_ns) if event.node_on_cpu_ns else None,
            *(value for figures, names in zip(sides, kept, strict=True)
              for value in (figures.values() if names is None
                            else [figures[n] for n in names]))])

    def _sched_plan(self, shape: tuple[tuple[str, ...], ...]) -> tuple:
        """The statement for sched figures of these names, by _SCHED_SIDES, and the names it
        keeps of each (None: all): a figure the table has no column for (a newer
        probes process's) is left out, where it would fail every batch as a broken store
        does."""
        columns = self._columns("sched_stats")
        kept = [tuple(n for n in names if f"{side}_{n}" in columns)
                for side, names in zip(_SCHED_SIDES, shape, strict=True)]
        for side, names, ours in zip(_SCHED_SIDES, shape, kept, strict=True):
            if ours != names:
                log.warning("sched_stats: no column for %s figure(s) %s; not stored", side,
                            ", ".join(sorted(set(names) - set(ours)))[:200])
        sql = _statement("sched_stats", (*_SCHED_KEY_COLUMNS,
                                         *(f"{side}_{n}" for side, ours in
                                           zip(_SCHED_SIDES, kept, strict=True) for n in ours)),
                         "insert", ("pid", "start_time", "ts"))
        if len(self._sched_plans) >= 256:     # a sender's names are its own: bounded
            self._sched_plans.clear()
        plan = self._sched_plans[shape] = (
            sql, *(None if ours == names else ours
                   for names, ours in zip(shape, kept, strict=True)))
        return plan

    def _on_process_exec(self, envelope: Envelope, event: ProcessExec) -> None:
        # at the batch's end with the others (a statement an exec cost half its event): a
        # process row that comes later in the batch gets its exec's file too
        self._held.add_after(_SET_EXE_FILENAME,
                             [event.filename, event.process.pid, event.process.start_time])
        self._insert_process_event(_event_row(envelope), exec_dedup_key(event))

    def _on_process_forked(self, envelope: Envelope, event: ProcessForked) -> None:
        self._insert("processes", {
            "pid": event.child.pid, "start_time": event.child.start_time,
            "ppid": event.parent.pid, "first_seen": event.ts, "last_seen": event.ts,
        }, ignore=True)
        row = _event_row(envelope)
        row.update(pid=event.child.pid, start_time=event.child.start_time)
        self._insert_process_event(row, ONCE_PER_PROCESS)

    def _insert_process_event(self, row: dict, dedup_key: str) -> None:
        """An events row stored once per (kind, pid, start_time, dedup_key): see above."""
        self._held.add("events", _INSERT_PROCESS_EVENT, [*row.values(), dedup_key])

    def _insert_event(self, row: dict) -> None:
        """An events row of a kind that is not a process's once-only event."""
        self._held.add("events", _INSERT_EVENT, list(row.values()))

    # --- cuda handlers ---
    def _on_cuda_stats(self, envelope: Envelope, event: CudaStats) -> None:
        row: dict[str, object] = {
            "pid": event.process.pid, "start_time": event.process.start_time,
            "ts": event.ts, "interval_ns": event.interval_ns, "calls": event.calls,
            "errors": event.errors, **event.totals(), "overhead_ns": event.overhead_ns,
            "traced_since_start": int(event.traced_since_start)}
        row["detail"] = json_text({
            "launches": event.launches, "grid_log2": event.grid_log2,
            "block_log2": event.block_log2, "copies": event.copies, "syncs": event.syncs,
            "sync_log2": event.sync_log2, "memory": event.memory})
        self._upsert("cuda_stats", row, pk=("pid", "start_time", "ts"))

    def _on_cuda_call(self, envelope: Envelope, event: CudaCall) -> None:
        row = {k: v for k, v in vars(event).items() if k not in ("process", "raw_ts")}
        row.update(pid=event.process.pid, start_time=event.process.start_time,
                   reasons=",".join(event.reasons))
        self._insert("cuda_calls", row)

    def _on_cuda_library(self, envelope: Envelope, event: CudaLibrary) -> None:
        self._insert_event(_event_row(envelope))

    # --- inference engine handlers ---
    def _on_engine_sample(self, envelope: Envelope, event: EngineSample) -> None:
        """One engine_samples row (its known values, one column each) and the engine's GPU
        processes in engine_members, once each."""
        known = self._columns("engine_samples") - _ENGINE_SAMPLE_KEYS
        process = event.process
        row = {"ts": event.ts, "engine": event.engine[:32], "endpoint": event.endpoint[:512],
               "pid": process.pid if process else None,
               "start_time": process.start_time if process else None,
               "version": event.version[:32], "gpu_ids": json_text(event.gpu_ids[:64])}
        row.update({k: float(v) for k, v in event.values.items() if k in known})
        self._insert("engine_samples", row)
        if process is not None:
            for member in event.processes[:64]:
                self._insert("engine_members", {
                    "pid": member.pid, "start_time": member.start_time,
                    "engine_pid": process.pid, "engine_start_time": process.start_time,
                    "since": event.ts}, ignore=True)

    # --- Python stack sampler handlers ---
    def _on_python_stacks(self, envelope: Envelope, event: PythonStacks) -> None:
        """One row per (finding, sampled process): the window's aggregate, replaced by a
        later one of the same window (cumulative)."""
        self._upsert("python_stacks", {
            "finding_id": event.finding_id, "pid": event.process.pid,
            "start_time": event.process.start_time, "gpu_id": event.gpu_id,
            "rule_id": event.rule_id, "started": event.started, "ts": event.ts,
            "interval_ms": event.interval_ms, "samples": event.samples,
            "final": int(event.final), "stacks": json_text(clean_rows(event.stacks)),
            "dropped": json_text(event.dropped, sort_keys=True, default=str),
            "error": event.error[:500]}, pk=("finding_id", "pid", "start_time"))

    # --- GPU source handlers ---
    def _columns(self, table: str) -> set[str]:
        """The table's columns, read once."""
        columns = self._table_columns.get(table)
        if columns is None:
            columns = self._table_columns[table] = set(self.db[table].columns_dict)
        return columns

    def _gpu_columns(self) -> set[str]:
        if not hasattr(self, "_gpu_sample_columns"):    # the same set each time: see samples
            self._gpu_sample_columns = self._columns("gpu_sample_data") - {
                "gpu", "ts", "instance"}
        return self._gpu_sample_columns

    def _touch_gpu(self, gpu_id: str, ts: int, simulated: bool, source: str) -> None:
        if gpu_id in self._gpus_seen:
            self._gpus_seen[gpu_id] = max(self._gpus_seen[gpu_id], ts)
            return
        self._gpus_seen[gpu_id] = ts
        self.db.execute("insert into gpus (id, simulated, source, first_seen, last_seen) "
                        "values (?, ?, ?, ?, ?) on conflict(id) do update set "
                        "last_seen = max(last_seen, excluded.last_seen)",
                        [gpu_id, int(simulated), source, ts, ts])

    def _on_gpu_seen(self, envelope: Envelope, event: GpuSeen) -> None:
        self._touch_gpu(event.gpu_id, event.ts, event.simulated, event.source)
        self._minor_gpus.clear()            # it may give this GPU's row its minor
        self.db.execute(
            "update gpus set uuid = ?, pci_bus_id = ?, gpu_index = ?, minor = coalesce(?, minor),"
            " model = ?, driver_version = ?, simulated = ?, source = ?,"
            " numa_node = coalesce(?, numa_node) where id = ?",
            [event.uuid, event.pci_bus_id, event.index, event.minor, event.model,
             event.driver_version, int(event.simulated), event.source, event.numa_node,
             event.gpu_id])

    def _on_gpu_sample(self, envelope: Envelope, event: GpuSample) -> None:
        self._touch_gpu(event.gpu_id, event.ts, event.simulated, event.source)
        row = encode_fields(event.fields, self._gpu_columns())   # compact rows
        names = tuple(row)
        sql = self._sample_sql.get(names)
        if sql is None:
            if len(self._sample_sql) >= 256:      # sources change what they read: rarely
                self._sample_sql.clear()
            sql = self._sample_sql[names] = _statement(
                "gpu_sample_data", ("gpu", "ts", "instance", *names), "insert or replace")
        self._held.add("gpu_sample_data", sql,
                       [self._gpu_key(event.gpu_id), event.ts, event.instance, *row.values()])
        if event.instance:
            key = (event.gpu_id, event.instance)
            profile, first, last = self._instances_seen.get(key, ("", event.ts, event.ts))
            self._instances_seen[key] = (event.labels.get("mig_profile") or profile,
                                         min(first, event.ts), max(last, event.ts))

    def _gpu_key(self, gpu_id: str) -> int | None:
        """The GPU's gpus.gpu_key (its row is written by _touch_gpu before this is asked)."""
        gpu_key = self._gpu_keys.get(gpu_id)
        if gpu_key is None:
            row = self.db.conn.execute("select gpu_key from gpus where id = ?",
                                       [gpu_id]).fetchone()
            gpu_key = self._gpu_keys[gpu_id] = row[0] if row else None
        return gpu_key

    def _on_gpu_xid(self, envelope: Envelope, event: GpuXid) -> None:
        self._touch_gpu(event.gpu_id, event.ts, event.simulated, event.source)
        self._insert_event(_event_row(envelope, gpu_id=event.gpu_id))  # body: before_start
        if event.before_start:
            # On the GPU's row too, so the GPU page shows it without searching the events
            # table (no index by GPU); each start that sees it again notes its own first read.
            self.db.execute("update gpus set xid_before_start = ?, xid_before_start_seen = ? "
                            "where id = ?", [event.xid, event.ts, event.gpu_id])

    def _on_gpu_state(self, envelope: Envelope, event: GpuState) -> None:
        self._touch_gpu(event.gpu_id, event.ts, event.simulated, event.source)
        self.db.execute("update gpus set state = ?, state_since = ? where id = ?",
                        [event.state, event.ts, event.gpu_id])
        self._insert_event(_event_row(envelope, gpu_id=event.gpu_id))

    def _on_gpu_processes(self, envelope: Envelope, event: GpuProcesses) -> None:
        for p in event.processes:
            self._insert("gpu_processes", {
                "gpu_id": event.gpu_id, "ts": event.ts, "pid": p.get("pid"),
                "start_time": p.get("start_time"), "used_memory_mib": p.get("used_memory_mib"),
                "sm_util": p.get("sm_util"), "mem_util": p.get("mem_util"),
                "enc_util": p.get("enc_util"), "dec_util": p.get("dec_util")}, replace=True)

    # --- kernel log and cron handlers ---
    # A kernel-log record's one home is kernel_log (since m119 no events row repeats it).
    def _advance_cursor(self, source: str, origin: str, cursor: str, boot_id: str,
                        ts: int) -> None:
        # every column: the batch's last one is what counts
        self._held.add_latest(("source_cursors", source), _WRITE_CURSOR,
                              [source, origin, cursor, boot_id, ts])

    def _on_kernel_log_record(self, envelope: Envelope, event: KernelLogRecord) -> None:
        if event.cursor in self._klog_cursors or self.db.execute(
                "select 1 from kernel_log where cursor = ?", [event.cursor]).fetchone():
            return    # re-sent after a restart of the source: already stored with its cursor
        self._klog_cursors.add(event.cursor)     # its row is held until the batch's end
        if event.record_kind == "gpu_uuid" and event.pci and event.uuid:
            note_pci_uuid(self.db, event.pci, event.uuid, event.ts)
        gpu_id = resolve_gpu(self.db, uuid=event.uuid, pci=event.pci)
        self._held.add("kernel_log", _INSERT_KERNEL_LOG, [   # in _KERNEL_LOG_COLUMNS' order
            event.cursor, event.ts, event.raw_ts, event.boot_id, event.origin,
            event.record_kind, event.xid, event.sxid, event.pci, gpu_id, event.pid, event.name,
            event.gpu_instance, event.compute_instance, event.message,
            json_text(event.details, sort_keys=True), event.line, event.driver_version])
        self._advance_cursor("klog", event.origin, event.cursor, event.boot_id, event.ts)

    def _on_kernel_log_checkpoint(self, envelope: Envelope, event: KernelLogCheckpoint) -> None:
        self._advance_cursor("klog", event.origin, event.cursor, event.boot_id, event.ts)

    def _on_cron_schedule(self, envelope: Envelope, event: CronSchedule) -> None:
        self.db.execute("delete from cron_jobs")
        self.db.table("cron_jobs").insert_all(
            [{**job, "updated_at": event.ts} for job in event.jobs], pk="ident", replace=True)

    def _on_cron_execution(self, envelope: Envelope, event: CronExecution) -> None:
        if self.db.execute("select 1 from cron_runs where cursor = ?",
                           [event.cursor]).fetchone():
            return
        self._insert("cron_runs", {
            "cursor": event.cursor, "ts": event.ts, "phase": event.phase, "user": event.user,
            "command": event.command, "job_pid": event.job_pid,
            "job_start_time": event.job_start_time, "cron_pid": event.cron_pid,
            "gpu_action": event.gpu_action, "boot_id": event.boot_id, "ended_at": None,
        })
        if event.phase == "ended" and event.job_pid is not None:
            self.db.execute("update cron_runs set ended_at = ? where job_pid = ? and "
                            "phase = 'started' and ended_at is null and boot_id = ?",
                            [event.ts, event.job_pid, event.boot_id])
        self._advance_cursor("cron", "journald", event.cursor, event.boot_id, event.ts)
        row = _event_row(envelope)
        row["pid"], row["start_time"] = event.job_pid, event.job_start_time
        self._insert_event(row)

    # --- correlator handlers ---
    # Rows are written with prepared SQL (see _statement): sqlite-utils' insert and upsert
    # introspect the table on every call, which cost ~1 ms an event. Same semantics: upsert
    # inserts the row or updates the columns given; lists and dicts are stored as JSON.
    @staticmethod
    def _values(row: dict) -> list:
        return [json_text(v, default=str) if isinstance(v, _JSON_TYPES) else v
                for v in row.values()]

    def _insert(self, table: str, row: dict, ignore: bool = False,
                replace: bool = False) -> None:
        verb = "insert or ignore" if ignore else "insert or replace" if replace else "insert"
        self._write(table, _statement(table, tuple(row), verb), self._values(row))

    def _upsert(self, table: str, row: dict, pk: str | tuple[str, ...]) -> None:
        pk = (pk,) if isinstance(pk, str) else tuple(pk)
        self._write(table, _statement(table, tuple(row), "insert", pk), self._values(row))

    def _write(self, table: str, sql: str, values: list) -> None:
        if table in _HELD_TABLES:
            self._held.add(table, sql, values)
        else:
            self.db.conn.execute(sql, values)


    # --- rules handlers ---
    def _on_rule_finding(self, envelope: Envelope, event: RuleFinding) -> None:
        """One row per finding: created at onset, updated on escalation, closed on clearing."""
        process = event.process
        existing = self.db.execute("select first_ts from rule_findings where finding_id = ?",
                                   [event.finding_id]).fetchone()
        row = {"finding_id": event.finding_id, "rule_id": event.rule_id, "title": event.title,
               # on the one scale even from an older rules process (warn/high mapped)
               "severity": sev.worst([event.severity]), "state": event.state,
               "gpu_id": event.gpu_id, "instance": event.instance,
               "mig_profile": event.mig_profile,
               "pid": process.pid if process else None,
               "start_time": process.start_time if process else None,
               "window_start": event.window_start, "window_end": event.window_end,
               "root_cause": event.root_cause, "verify": event.verify,
               "shadow": int(event.shadow), "rule_group": event.group,
               "rule_kind": event.rule_kind or None, "scope": event.scope or None,
               "explains": json_text(event.explains) if event.rule_kind else None,
               "unexplained": json_text(event.unexplained) if event.rule_kind else None,
               "first_ts": existing[0] if existing else event.ts, "last_ts": event.ts,
               "cleared_at": event.ts if event.state == "cleared" else None}
        if event.state != "cleared" or not existing:   # a clearing keeps the firing's advice
            row.update(evidence=json_text(event.evidence, sort_keys=True, default=str),
                       fixes=json_text(event.fixes))
            # and its onset: since, processes (NULL both from a sender that predates them)
            row.update(since=event.since or None, processes=json_text(
                [{"pid": p.pid, "start_time": p.start_time} for p in event.processes])
                if event.since else None)
        self._upsert("rule_findings", row, pk="finding_id")


    def _on_source_health(self, envelope: Envelope, event: SourceHealth) -> None:
        self.record_health(event.source, event.state, event.detail, event.counters, event.ts)

    def record_health(self, source: str, state: str, detail: str,
                      counters: dict[str, int], ts: int) -> None:
        row = {"source": source, "state": state, "detail": detail,
               "counters": json_text(counters, sort_keys=True), "last_seen": ts}
        if self.db.conn.in_transaction:      # a batch's, or the caller's: committed with it
            self._upsert("source_health", row, pk="source")
            return
        with self.db.atomic():               # on its own: its own transaction
            self._upsert("source_health", row, pk="source")
