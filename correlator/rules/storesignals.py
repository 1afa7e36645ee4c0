"""Signals read from the store (a read-only connection), for the engine in the service.

The SQL lives in ``gpuwhy.store.streams``; this class caches, widens windows and shapes
the rows it returns into signal rows. Tables read: ``gpu_samples`` (one row per GPU and
instant, and one per MIG instance and instant: their own series), ``gpu_instances`` (a
GPU's MIG instances and their profiles), ``sched_stats``, ``cuda_stats``,
``engine_samples`` and ``engine_members`` (an inference engine's scrapes, for its process
and its GPU processes), ``driver_call_stats`` (cumulative: this class keeps one snapshot
per evaluation round, so call rates need two rounds), ``driver_calls``,
``kernel_log``, ``cron_runs``, ``events`` (gpu_xid, gpu_state, process_exec,
process_exited), ``processes``, ``gpu_bindings``, ``gpu_processes``, ``gpus``.
Everything read in a round is cached for that round: the same window is read once for all
the rules that ask for it. Process environments are read from ``processes.env``: the
probes recorded them (the variables of ``probes.environment``), so the engine reads no
procfs and sees them whoever it runs as.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import cast

from sqlite_utils import Database

from gpuwhy.clock import now_ns
from gpuwhy.correlator.rules.signals import (
    FORGET_NS,
    EventRows,
    ProcessFacts,
    RowWindow,
    Scope,
    Signals,
    _slice,
    mig_order,
    names_a_monitor,
    pci_key,
)
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import action_kind, reset_kind, state_kind
from gpuwhy.rules.vocabulary import Row, call_class_totals
from gpuwhy.store import streams

GPU_RECENT_NS = 3600 * 10**9
NVML_RECENT_NS = 60 * 10**9
SNAPSHOTS_KEPT = 400
# Streams the probes send as they happen (seconds late at most), the busiest ones: read
# incrementally. The kernel log and cron come from journald, whose backlog is read at
# start, hours late: those are read whole each round (a few rows).
LIVE_STREAMS = frozenset({"driver.call", "proc.exec", "proc.exit"})
_NOT_FIELDS = {"gpu_id", "ts", "instance", "time", "uuid", "gpu_index", "gpu"}


def _fields(row: dict) -> dict:
    """A sample row's fields, in place: dropping the few other columns is cheaper than
    copying the ~50 fields of every row read."""
    for name in _NOT_FIELDS:
        row.pop(name, None)
    return row


class StoreSignals(Signals):
    """Signals over an open store; ``begin(now)`` starts a round (and drops the caches)."""

    def __init__(self, db: Database):
        self.db = db
        self._now: int | None = None
        self._cache: dict[tuple, object] = {}
        self._snapshots: dict[ProcessKey, deque] = defaultdict(
            lambda: deque(maxlen=SNAPSHOTS_KEPT))
        self._events: dict[str, RowWindow[list]] = {}   # per live stream, kept between rounds
        # the processes asked about since the last prune: the others' figures are let go
        self._asked: set[ProcessKey] = set()
        self._pruned_at: int | None = None

    def begin(self, now: int) -> None:
        super().begin(now)
        self._now = now
        self._cache.clear()
        if self._pruned_at is None:
            self._pruned_at = now
        elif now - self._pruned_at > FORGET_NS:      # the gone processes' snapshots
            for process in [p for p in self._snapshots if p not in self._asked]:
                del self._snapshots[process]
            self._asked, self._pruned_at = set(), now

    def now(self) -> int:
        return self._now if self._now is not None else now_ns()

    def held_rows(self) -> int:
        """How many rows are held between rounds: derived series, the busy streams' rows
        and the driver-call snapshots of each process."""
        return super().held_rows() + sum(len(held.rows) for held in self._events.values()) \
            + sum(len(snapshots) for snapshots in self._snapshots.values())

    def _cached(self, key: tuple, load):  # noqa: ANN001, ANN202
        if key not in self._cache:
            self._cache[key] = load()
        return self._cache[key]

    def _gpu(self, gpu_id: str) -> dict:
        rows = self._cached(("gpu", gpu_id), lambda: streams.gpu_row(self.db, gpu_id))
        return rows[0] if rows else {}

    def gpus(self) -> list[str]:
        return [r["id"] for r in self._cached(("gpus",), lambda: streams.recent_gpus(
            self.db, self.now() - GPU_RECENT_NS))]

    def gpu_model_name(self, gpu_id: str) -> str:
        return self._gpu(gpu_id).get("model") or ""

    def gpu_numa_node(self, gpu_id: str) -> int | None:
        return self._gpu(gpu_id).get("numa_node")

    def processes(self, gpu_id: str) -> list[ProcessKey]:
        now = self.now()
        rows = streams.live_processes_on(self.db, gpu_id, now - NVML_RECENT_NS)
        return sorted(ProcessKey(r["pid"], r["start_time"]) for r in rows)

    def process_list(self, gpu_id: str) -> list[ProcessKey] | None:
        rows = streams.listed_processes_on(self.db, gpu_id, self.now() - NVML_RECENT_NS)
        if rows is None:
            return None
        return sorted(ProcessKey(r["pid"], r["start_time"]) for r in rows)

    def facts(self, process: ProcessKey) -> ProcessFacts | None:
        rows = streams.process_row(self.db, process)
        if not rows:
            return None
        row = rows[0]
        return ProcessFacts(comm=row["comm"] or "", cmdline=row["cmdline"] or "",
                            exe=row["exe"] or "", cgroup=row["cgroup"] or "",
                            first_seen=row["first_seen"], env=streams.environment(row["env"]),
                            started_at=row["started_at"])

    def instances(self, gpu_id: str) -> dict[str, str]:
        rows = self._cached(("instances", gpu_id), lambda: streams.gpu_instances_on(
            self.db, gpu_id, self.now() - GPU_RECENT_NS))
        return {r["instance"]: r["profile"] or "" for r in
                sorted(rows, key=lambda r: mig_order(r["instance"]))}

    def gpu_rows(self, gpu_id: str, start: int, end: int,
                 instance: str = "") -> list[tuple[int, Row]]:
        rows = self._window_rows(("gpu_rows", gpu_id, instance), start, end, lambda s, e: [
            (r["ts"], _fields(r)) for r in streams.gpu_samples_between(
                self.db, gpu_id, s, e, instance)])
        return _slice(rows, start, end)

    def sched_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return self._process_rows("sched_stats", process, start, end)

    def cuda_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return self._process_rows("cuda_stats", process, start, end)

    def engine_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        rows = self._window_rows(("engine_samples", process), start, end, lambda s, e: [
            (r["ts"], r) for r in streams.engine_samples_between(self.db, process, s, e)])
        return _slice(rows, start, end)

    def _process_rows(self, table: str, process: ProcessKey, start: int,
                      end: int) -> list[tuple[int, Row]]:
        rows = self._window_rows((table, process), start, end, lambda s, e: [
            (r["ts"], r) for r in streams.process_stats_between(self.db, table, process, s, e)])
        return _slice(rows, start, end)

    def _window_rows(self, key: tuple, start: int, end: int, load) -> list:  # noqa: ANN001
        """Rows of ``key`` for the widest window asked this round, loaded once."""
        held = cast("tuple[int, int, list] | None", self._cache.get(key))
        if held is None or held[0] > start or held[1] < end:
            low = start if held is None else min(start, held[0])
            high = end if held is None else max(end, held[1])
            held = (low, high, load(low, high))
            self._cache[key] = held
        return held[2]

    def call_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        snapshots = self._snapshots[process]
        self._asked.add(process)
        if ("calls", process) not in self._cache:
            self._cache[("calls", process)] = True
            ops = streams.call_totals_by_op(self.db, process)
            if ops:
                ts = max(op["updated_at"] or 0 for op in ops)
                if not snapshots or snapshots[-1][0] < ts:
                    # read only: a list of dicts is one of mappings
                    snapshots.append((ts, call_class_totals(cast("list[Mapping]", ops))))
        return _slice(snapshots, start, end)

    def _stream(self, stream: str, start: int, end: int) -> list[tuple[int, dict]]:
        """The stream's rows in [start, end]: read once, then only what is new each round,
        not every window again at every rule and round."""
        held = self._events.get(stream)
        if held is None or end - FORGET_NS > held.high:
            held = self._events[stream] = RowWindow(start, EventRows())
        return held.rows_in(start, end, self._now,
                            lambda s, e: self._load_events(stream, s, e))

    def event_rows(self, stream: str, scope: Scope, start: int,
                   end: int) -> list[tuple[int, dict]]:
        load = self._stream if stream in LIVE_STREAMS else self._load_events
        rows = self._cached(("events", stream, start, end), lambda: load(stream, start, end))
        if stream == "proc.exit":        # one row per GPU the process was bound to
            return [(ts, row) for ts, row in rows if row["_gpu"] == scope.gpu_id]
        if stream not in ("journal.xid", "journal.nvrm", "gpu.xid", "gpu.state"):
            return rows
        gpu = self._gpu(scope.gpu_id)
        pci = pci_key(gpu.get("pci_bus_id") or "") if gpu.get("pci_bus_id") else None
        out = []
        for ts, row in rows:
            owner, row_pci = row.get("_gpu"), row.get("_pci")
            if owner == scope.gpu_id or (pci is not None and row_pci and
                                         pci_key(row_pci) == pci) or \
                    (owner is None and not row_pci):
                out.append((ts, row))
        return out

    def _load_events(self, stream: str, start: int, end: int) -> list[tuple[int, dict]]:
        if stream in ("journal.xid", "journal.nvrm"):
            return [(r["ts"], {"_gpu": r["gpu_id"], "_pci": r["pci"], "code": r["xid"],
                               "pid": r["pid"], "name": r["name"] or "", "kind": r["kind"],
                               "text": r["message"] or ""})
                    for r in streams.kernel_log_between(self.db, stream == "journal.xid",
                                                        start, end)]
        if stream in ("gpu.xid", "gpu.state"):
            kind = "gpu_xid" if stream == "gpu.xid" else "gpu_state"
            out = []
            for r in streams.gpu_events_between(self.db, kind, start, end):
                body = json.loads(r["body"] or "{}")
                if body.get("before_start"):
                    continue        # as the live signals: no time of its own, not counted
                out.append((r["ts"], {"_gpu": r["gpu_id"], "code": body.get("xid"),
                                      "state": body.get("state"),
                                      "text": body.get("detail", ""),
                                      "reset": state_kind(body.get("state"))}))
            return out
        if stream == "cron.run":
            return [(r["ts"], {"command": r["command"] or "", "user": r["user"] or "",
                               "gpu_action": r["gpu_action"] or "",
                               "reset": action_kind(r["gpu_action"])})
                    for r in streams.cron_starts_between(self.db, start, end)]
        if stream == "proc.exec":
            out = []
            for r in streams.process_events_between(self.db, "process_exec", start, end):
                cmdline = r["cmdline"] or ""
                action = gpu_action(cmdline) or ""
                out.append((r["ts"], {
                    "_process": ProcessKey(r["pid"], r["start_time"]),
                    "filename": json.loads(r["body"] or "{}").get("filename", ""),
                    "cmdline": cmdline, "comm": r["comm"] or "", "gpu_action": action,
                    "reset": action_kind(action)}))
            return out
        if stream == "proc.exit":
            out = []
            for r in streams.gpu_process_exits_between(self.db, start, end):
                if names_a_monitor(r["comm"], r["cmdline"]):
                    continue
                body = json.loads(r["body"] or "{}")
                out.append((r["ts"], {
                    "_process": ProcessKey(r["pid"], r["start_time"]), "_gpu": r["gpu_id"],
                    "comm": r["comm"] or "", "exit_code": body.get("exit_code"),
                    "signal": body.get("signal")}))
            return out
        if stream == "driver.call":
            return [(r["ts"], {"_process": ProcessKey(r["pid"], r["start_time"]),
                               "op": r["op"] or "", "sub_name": r["sub_name"] or "",
                               "reasons": r["reasons"] or "", "status": r["status_name"] or "",
                               "ret": r["ret"] if r["ret"] is not None else 0,
                               "latency_ms": (r["latency_ns"] or 0) / 1e6,
                               "reset": reset_kind(r["sub_name"])})
                    for r in streams.driver_calls_between(self.db, start, end)]
        raise KeyError(stream)
