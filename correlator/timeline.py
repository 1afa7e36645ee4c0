"""Per-process timelines at 1 s resolution: fold events into process-second values.

A process second holds the process's ioctl count and rate by operation, on-CPU / run-queue /
sleep / blocked time of its own threads and of its workers, its per-process GPU utilisation
where NVML has it, and its CUDA launches, syncs, copies and allocations where the CUDA
uprobes are on. This module computes the values and how a stall is classified from the
scheduler's totals; the handlers only compute and hold, and ``write_pending`` hands the
batch's values to :mod:`gpuwhy.store.process_seconds`, which writes them and reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import (
    CudaStats,
    DriverCallStats,
    Event,
    GpuProcesses,
    ProcessExited,
    SchedStats,
    methods_by_kind,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store import process_seconds
from gpuwhy.wire import json_text

_MS = 1_000_000


class _HeldSecond:
    """One process second's sched intervals and ioctl deltas of this batch, in arrival order:
    write_pending replays them on the stored row as the per-event upserts did, so the
    floating-point sums and the ioctl_ops key order come out the same."""

    __slots__ = ("sched", "ioctls")

    def __init__(self) -> None:
        self.sched: list[tuple[float, ...]] = []
        self.ioctls: list[dict[str, int]] = []

    def row(self, stored: tuple | None) -> list:
        """The held columns' new values (None: not touched) over ``stored`` (None: no row)."""
        sched: list = [None] * len(process_seconds.SCHED_COLUMNS)
        if self.sched:
            # insert: the first interval's figures; conflict: coalesce(col, 0) + figures
            totals: list | None = [v or 0 for v in stored[:-1]] if stored else None
            for figures in self.sched:
                totals = list(figures) if totals is None else \
                    [t + f for t, f in zip(totals, figures, strict=True)]
            sched = totals if totals is not None else sched
        if not self.ioctls:
            return [*sched, None, None]
        merged = json.loads(stored[-1]) if stored and stored[-1] else None
        for by_op in self.ioctls:      # each call's ops first, then what was stored before
            step = dict(by_op)
            if merged:
                for name, count in merged.items():
                    step[name] = step.get(name, 0) + count
            merged = step
        merged = merged or {}
        return [*sched, sum(merged.values()), json_text(merged)]


class TimelineBuilder:
    """Folds sched, driver-call and NVML per-process events into process seconds.

    Sched and driver-call stats come for every process every poll interval (most of a
    batch): they are held per process second and written once by ``write_pending`` (a
    select and an upsert per event cost ~10 µs of a ~25 µs event)."""

    def __init__(self) -> None:
        # Driver-call stats are totals: the last count per (pid, start_time), then per
        # (path, cmd, sub). Keys are plain tuples: ProcessKey's dataclass __hash__ runs in
        # Python, and these dicts are read for every operation of every flush.
        self._last_counts: dict[tuple[int, int], dict[tuple, int]] = {}
        self._held: dict[tuple[int, int, int], _HeldSecond] = {}
        # CUDA and NVML per-process values of this batch, in arrival order: (process,
        # second, values, added or set), applied by write_pending as they came
        self._values: list[tuple[ProcessKey, int, dict, bool]] = []
        self._handlers = methods_by_kind(self, "_on_")

    def handler(self, kind: str) -> Callable[[Database, Event], None] | None:
        """What to feed an event of ``kind`` to (None: the timelines do not read it)."""
        return self._handlers.get(kind)

    def write_pending(self, db: Database) -> None:
        """Write the held process seconds: call before anything reads process_seconds. The
        handlers only compute; this is where the batch's process seconds are written."""
        held, self._held = self._held, {}
        values, self._values = self._values, []
        stored = process_seconds.read_held(db, list(held))
        process_seconds.write_held(db, [[*key, *pending.row(stored.get(key))]
                                        for key, pending in held.items()])
        for key, second, figures, add in values:
            process_seconds.upsert_second(db, key, second, figures, add=add)

    def discard_pending(self) -> None:
        """Forget held seconds whose writes were rolled back (a failed decide)."""
        self._held.clear()
        self._values.clear()

    def _hold(self, key: ProcessKey, ts: int) -> _HeldSecond:
        second = (key.pid, key.start_time, ts // NS_PER_SECOND)
        held = self._held.get(second)
        if held is None:
            held = self._held[second] = _HeldSecond()
        return held

    def _on_sched_stats(self, db: Database, event: SchedStats) -> None:
        own, workers = event.own.get, event.workers.get
        # flushes come every probes.poll_interval: several may end in a second, and add up
        self._hold(event.process, event.ts).sched.append((
            own("on_cpu_ns", 0) / _MS, own("runqueue_ns", 0) / _MS,
            own("sleep_ns", 0) / _MS, own("blocked_ns", 0) / _MS,
            workers("on_cpu_ns", 0) / _MS, workers("runqueue_ns", 0) / _MS,
            workers("blocked_ns", 0) / _MS))

    def _on_driver_call_stats(self, db: Database, event: DriverCallStats) -> None:
        by_op: dict[str, int] = {}
        process, path = event.process, event.path
        last = self._last_counts.get((process.pid, process.start_time))
        if last is None:
            last = self._last_counts[(process.pid, process.start_time)] = {}
        for op in event.ops:
            key, count = (path, op["cmd"], op["sub"]), op["count"]
            delta = count - last.get(key, 0)
            if delta > 0:
                last[key] = count
                name = op.get("sub_name") or op["op"]
                by_op[name] = by_op.get(name, 0) + delta
            elif delta:
                last[key] = count      # the count went back: a new total from there
        if by_op:
            self._hold(process, event.ts).ioctls.append(by_op)

    def _on_cuda_stats(self, db: Database, event: CudaStats) -> None:
        figures = event.totals()
        self._values.append((event.process, event.ts // NS_PER_SECOND, {
            "cuda_launches": figures["launches"] + figures["graph_launches"],
            "cuda_syncs": figures["syncs"], "cuda_sync_ms": figures["sync_blocked_ns"] / _MS,
            "cuda_htod_bytes": figures["htod_bytes"], "cuda_dtoh_bytes": figures["dtoh_bytes"],
            "cuda_pageable_bytes": figures["htod_pageable_bytes"]
            + figures["dtoh_pageable_bytes"],
            "cuda_allocs": figures["allocs"] + figures["host_allocs"],
            "cuda_frees": figures["frees"]}, True))

    def _on_process_exited(self, db: Database, event: ProcessExited) -> None:
        self._last_counts.pop((event.process.pid, event.process.start_time), None)

    def _on_gpu_processes(self, db: Database, event: GpuProcesses) -> None:
        for p in event.processes:
            if p.get("start_time") is None:
                continue
            self._values.append((
                ProcessKey(p["pid"], p["start_time"]), event.ts // NS_PER_SECOND,
                {"gpu_id": event.gpu_id, "sm_util": p.get("sm_util"),
                 "used_memory_mib": p.get("used_memory_mib")}, False))


def classify_stall(row: Sequence[float | None] | None) -> str:
    """Why a process with an idle GPU is not feeding it: on-CPU busy, blocked or waiting,
    from its scheduler totals over the idle stretch (:func:`process_seconds.sched_totals`)."""
    if not row or row[0] is None:
        return "state unknown (no scheduler data)"
    on_cpu, blocked, sleep, runqueue, workers = (v or 0 for v in row)
    total = on_cpu + blocked + sleep + runqueue
    if total == 0:
        return "state unknown (no scheduler time)"
    if on_cpu + runqueue >= 0.5 * total:
        return "on-CPU busy (spinning or computing on the host)"
    if blocked >= sleep:
        return "blocked (uninterruptible wait: I/O or the driver)"
    return "waiting (sleeping, e.g. on a lock, the input pipeline or the GPU)"
