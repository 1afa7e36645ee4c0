"""What rules read: the Signals interface, its shared derivations, and the in-memory source.

A signal source answers four questions for a window ``[start, end]`` (realtime ns):
the series of a signal for a GPU (or one of its MIG instances) or a process, the events of
a stream, the facts of a process, and which GPUs, MIG instances and processes there are.
:class:`MemorySignals` is fed with bus events (``rules test --replay``, tests);
``StoreSignals`` (storesignals.py) reads the store.
Both turn raw rows into signals through :mod:`vocabulary`, so they agree by construction.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from gpuwhy.correlator.rules.signal_series import Series
from gpuwhy.events import (
    CronExecution,
    CudaStats,
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    EngineSample,
    Event,
    GpuProcesses,
    GpuSample,
    GpuSeen,
    GpuState,
    GpuXid,
    KernelLogRecord,
    ProcessExec,
    ProcessExited,
    ProcessSeen,
    SchedStats,
)
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.identity import GpuIdentity, ProcessKey, using_gpu_minor
from gpuwhy.reset import action_kind, reset_kind, state_kind
from gpuwhy.rules.vocabulary import (
    FACTS,
    MONITOR_PATTERN,
    SIGNALS,
    STREAMS,
    Row,
    Signal,
    call_class_totals,
    gpu_model,
)

MAX_TEXT = 4096
LATE_NS = 5 * 10**9          # rows may reach the store this late: derived again
# Rows are held back as far as the longest window asked of them in the last FORGET_NS (longer
# than a rule's cadence: a rule asks at each of its rounds); a series nobody asked for that
# long (its process or GPU gone) is dropped. Held longer, they would grow with the hours.
FORGET_NS = 15 * 60 * 10**9
TRIM_NS = 60 * 10**9         # rows past the reach are cut in one go at most this often


# A compute-process list older than this is not current (the sources send one a sample).
PROCESS_LIST_RECENT_NS = 60 * 10**9


@dataclass(frozen=True)
class Scope:
    """What one rule instance looks at: a GPU and, for process rules, one process on it;
    for instance rules one MIG GPU instance of it (``instance``, as :class:`GpuSample`
    names it; "" for the whole GPU), whose samples its ``gpu.*`` signals then read."""

    gpu_id: str
    process: ProcessKey | None = None
    instance: str = ""


@dataclass(frozen=True)
class ProcessFacts:
    """Process text facts, bounded; ``env`` holds only the variables rules asked for, and is
    None when the environment could not be read (the process is gone, no permission)."""

    comm: str = ""
    cmdline: str = ""
    exe: str = ""
    cgroup: str = ""
    first_seen: int | None = None
    env: Mapping[str, str] | None = None
    started_at: int | None = None

    @property
    def born(self) -> int | None:
        """When the process started (realtime ns), else when it was first seen: its age."""
        return self.started_at if self.started_at is not None else self.first_seen

    def text(self, name: str) -> str:
        return {"proc.cmdline": self.cmdline, "proc.comm": self.comm, "proc.exe": self.exe,
                "proc.cgroup": self.cgroup}[name][:MAX_TEXT]


def is_monitor(facts: ProcessFacts | None) -> bool:
    """G-MONITOR: nv-hostengine, dcgm-exporter, nvidia-smi, ... and gpuwhy itself."""
    return facts is not None and names_a_monitor(facts.comm, facts.cmdline)


@functools.lru_cache(maxsize=256)    # the stall check asks for each bound process, twice a second
def names_a_monitor(comm: str | None, cmdline: str | None, _compiled: list = []) -> bool:  # noqa: B006
    """Whether a process's name or command line is a GPU monitor's (MONITOR_PATTERN)."""
    if not _compiled:
        import re2
        _compiled.append(re2.compile(MONITOR_PATTERN))
    return any(_compiled[0].search(text[:MAX_TEXT]) for text in (comm, cmdline) if text)


def pci_key(pci: str) -> tuple[int, ...] | None:
    """``0000:18:00.0``, ``00000000:18:00.0`` and the kernel log's ``0000:18:00`` alike."""
    try:
        return tuple(int(part, 16) for part in pci.split(".")[0].split(":")[-3:])
    except ValueError:
        return None


def mig_order(instance: str) -> tuple:
    """MIG instance ids in number order (they are numbers as sources report them)."""
    return (0, int(instance), "") if instance.isdigit() else (1, 0, instance)


def derive_series(name: str, rows: Iterable[tuple[int, Row]]) -> Series:
    derive = SIGNALS[name].derive
    series = Series()
    times, values = series.times, series.values
    for ts, row in rows:
        value = derive(row)
        if value is not None:
            times.append(ts)
            values.append(value)
    return series


class Signals:
    """The interface rules evaluate against (and the derivations both sources share).

    Subclasses supply rows: ``gpu_rows`` (gpu_samples columns), ``sched_rows``
    (sched_stats columns), ``call_rows`` (cumulative per call class), ``cuda_rows``
    (:meth:`CudaStats.totals` and ``interval_ns``), ``event_rows``.
    """

    # Made by the first series() (subclasses need not call an __init__ here), kept between
    # rounds: each signal's derived values, by (owner, signal name).
    _derived: dict[tuple[object, str], RowWindow[Series]]

    def now(self) -> int:
        raise NotImplementedError

    def gpus(self) -> list[str]:
        raise NotImplementedError

    def gpu_model_name(self, gpu_id: str) -> str:
        raise NotImplementedError

    def gpu_numa_node(self, gpu_id: str) -> int | None:
        """The NUMA node the GPU is attached to, None when not known."""
        return None

    def processes(self, gpu_id: str) -> list[ProcessKey]:
        """Compute processes on the GPU (bound to it or listed by NVML), monitors included."""
        raise NotImplementedError

    def instances(self, gpu_id: str) -> dict[str, str]:
        """The GPU's MIG GPU instances that have samples, each with its profile ("" when the
        source does not tell it); empty for a GPU not in MIG mode."""
        return {}

    def process_list(self, gpu_id: str) -> list[ProcessKey] | None:
        """The living processes of the GPU's latest compute-process list (NVML's: those
        holding a context there), None when no list is recent (DCGM-only, no permission)."""
        return None

    def facts(self, process: ProcessKey) -> ProcessFacts | None:
        raise NotImplementedError

    def gpu_rows(self, gpu_id: str, start: int, end: int,
                 instance: str = "") -> list[tuple[int, Row]]:
        """The GPU's samples in the window: the whole GPU's, or one MIG instance's."""
        raise NotImplementedError

    def sched_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        raise NotImplementedError

    def call_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        raise NotImplementedError

    def cuda_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        raise NotImplementedError

    def engine_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        """Scrapes of the inference engine the process is, or serves (its GPU process)."""
        return []

    def event_rows(self, stream: str, scope: Scope, start: int,
                   end: int) -> list[tuple[int, dict]]:
        raise NotImplementedError

    def begin(self, now: int) -> None:
        """Start one evaluation round at ``now``: derived series nobody read for FORGET_NS
        (a process or GPU gone) are dropped."""
        self._round = now
        derived = getattr(self, "_derived", None)
        if derived:
            for key in [k for k, held in derived.items() if held.high < now - FORGET_NS]:
                del derived[key]

    def held_rows(self) -> int:
        """How many rows the derived series hold between rounds (their memory)."""
        return sum(len(held.rows) for held in getattr(self, "_derived", {}).values())

    # The interface rules use.
    def series(self, scope: Scope, name: str, start: int, end: int) -> Series:
        """Samples of signal ``name`` in ``[start, end]``; empty when not reported.

        Derived values are kept between rounds and extended with the new rows only (the
        last LATE_NS again, for rows that arrived late), so a round costs what arrived
        since the last one, not the length of the windows."""
        signal = SIGNALS[name]
        owner: object = scope.process
        if signal.per_gpu:
            owner = None if scope.process is None else (scope.process, scope.gpu_id)
        elif signal.source == "gpu":   # a MIG instance's series apart from the whole GPU's
            owner = (scope.gpu_id, scope.instance) if scope.instance else scope.gpu_id
        if owner is None:
            return Series()
        derived = getattr(self, "_derived", None)
        if derived is None:
            derived = self._derived = {}
        held = derived.get((owner, name))
        if held is None:
            held = derived[(owner, name)] = RowWindow(start, Series())
        return held.rows_in(start, end, getattr(self, "_round", None),
                            lambda s, e: self._derive(signal, owner, s, e))

    def _derive(self, signal: Signal, owner: object, start: int, end: int) -> Series:
        name, source = signal.name, signal.source
        if signal.per_gpu:               # a per-GPU signal of a process: (process, gpu_id)
            process, gpu_id = cast("tuple[ProcessKey, str]", owner)
            home = self.gpu_numa_node(gpu_id)
            return derive_series(name, [(ts, {**row, "gpu_numa_node": home})
                                        for ts, row in self.sched_rows(process, start, end)])
        if source == "gpu":              # gpu_id, or (gpu_id, instance) of a MIG instance
            gpu_id, instance = cast("tuple[str, str]", owner) if isinstance(owner, tuple) \
                else (cast(str, owner), "")
            return derive_series(name, self.gpu_rows(gpu_id, start, end, instance))
        process = cast(ProcessKey, owner)   # the other sources' signals are a process's
        if source == "sched":
            return derive_series(name, self.sched_rows(process, start, end))
        if source == "cuda":
            return derive_series(name, self.cuda_rows(process, start, end))
        if source == "engine":
            return derive_series(name, self.engine_rows(process, start, end))
        return derive_series(name, self.call_rows(process, start, end))

    def fact(self, scope: Scope, name: str) -> float | None:
        model = gpu_model(self.gpu_model_name(scope.gpu_id) or "")
        return None if model is None else FACTS[name][2](model)

    def events(self, scope: Scope, stream: str, start: int, end: int) -> list[tuple[int, dict]]:
        """Events of ``stream`` in the window; ``own`` marks those of the scope's process."""
        rows = self.event_rows(stream, scope, start, end)
        if "own" in STREAMS[stream].fields:
            rows = [(ts, {**row, "own": float(scope.process is not None
                                               and row.get("_process") == scope.process)})
                    for ts, row in rows]
        return rows


def _ts(row: tuple) -> int:
    return row[0]


def _slice(rows: Sequence, start: int, end: int) -> list:
    """The (ts, ...) rows with start <= ts <= end, of rows sorted by ts."""
    low = bisect.bisect_left(rows, start, key=_ts)
    high = bisect.bisect_right(rows, end, lo=low, key=_ts)
    if isinstance(rows, list):
        return rows[low:high]
    return [rows[i] for i in range(low, high)]


class EventRows(list):
    """(ts, row) rows in time order, with the operations a :class:`RowWindow` uses (those
    of a :class:`Series`)."""

    def position(self, ts: int) -> int:
        return bisect.bisect_left(self, ts, key=_ts)

    def between(self, start: int, end: int) -> list:
        return _slice(self, start, end)

    def prepend(self, earlier: list) -> None:
        self[:0] = earlier

    def cut_before(self, index: int) -> None:
        del self[:index]

    def cut_from(self, index: int) -> None:
        del self[index:]


_Rows = TypeVar("_Rows")


class HeldRows(Protocol[_Rows]):
    """What a :class:`RowWindow` holds: a :class:`Series` (its spans read as Series) or
    :class:`EventRows` (read as lists)."""

    def __len__(self) -> int: ...
    def position(self, ts: int, /) -> int: ...
    def between(self, start: int, end: int, /) -> _Rows: ...
    def prepend(self, earlier: _Rows, /) -> None: ...
    def extend(self, later: _Rows, /) -> None: ...
    def cut_before(self, index: int, /) -> None: ...
    def cut_from(self, index: int, /) -> None: ...


class RowWindow(Generic[_Rows]):
    """Rows of one source, (ts, ...) in time order (a derived :class:`Series`, or
    :class:`EventRows`), read for [low, high] and kept between rounds: extended with what
    arrived since, the last LATE_NS read again (rows reach the store that late) once a
    round, not at every rule that reads them in it (nothing arrives within a round). Held
    back only as far as the longest window asked in the last FORGET_NS (its ``reach``): an
    hour's window asked once is read again if asked again."""

    __slots__ = ("low", "high", "rows", "round", "reach", "reach_at")

    def __init__(self, start: int, rows: HeldRows[_Rows]):
        self.low, self.high = start, start - 1
        self.rows = rows
        self.round: int | None = None
        self.reach = 0
        self.reach_at = start

    def rows_in(self, start: int, end: int, round_now: int | None,
                load: Callable[[int, int], _Rows]) -> _Rows:
        """The rows in [start, end]; ``load(start, end)`` reads those of a span (of the
        rows' own kind)."""
        rows = self.rows
        if end - start >= self.reach or end - self.reach_at > FORGET_NS:
            self.reach, self.reach_at = end - start, end
        if start < self.low:
            rows.prepend(load(start, self.low - 1))
            self.low = start
        if end > self.high or (end > self.high - LATE_NS
                               and (self.round != round_now or round_now is None)):
            redo = max(self.low, self.high - LATE_NS + 1)
            rows.cut_from(rows.position(redo))
            rows.extend(load(redo, end))
            self.high, self.round = end, round_now
        if self.low < end - self.reach - TRIM_NS:
            rows.cut_before(rows.position(end - self.reach))
            self.low = end - self.reach
        return rows.between(start, end)


class MemorySignals(Signals):
    """Signals from bus events kept in memory for ``retention_ns`` (replays and tests).

    ``environ`` supplies process environments besides those ProcessSeen events carry
    (tests); it wins over theirs.
    """

    def __init__(self, retention_ns: int = 3600 * 10**9,
                 environ: Mapping[ProcessKey, Mapping[str, str]] | None = None):
        self.retention_ns = retention_ns
        self.clock = 0
        self.environ = dict(environ or {})
        self.models: dict[str, str] = {}
        self.numa_nodes: dict[str, int] = {}
        self.minors: dict[int, str] = {}
        self.pcis: dict[tuple[int, ...] | None, str] = {}
        self.bindings: dict[str, dict[ProcessKey, int]] = defaultdict(dict)
        self.nvml_procs: dict[str, tuple[int, list[ProcessKey]]] = {}
        self.process_facts: dict[ProcessKey, ProcessFacts] = {}
        self.exited: set[ProcessKey] = set()
        self._gpu: dict[str, list] = defaultdict(list)
        # MIG instances: their samples by (gpu, instance), their profiles by GPU
        self._gpu_instance: dict[tuple[str, str], list] = defaultdict(list)
        self.profiles: dict[str, dict[str, str]] = defaultdict(dict)
        self._sched: dict[ProcessKey, list] = defaultdict(list)
        self._calls: dict[ProcessKey, list] = defaultdict(list)
        self._cuda: dict[ProcessKey, list] = defaultdict(list)
        self._engine: dict[ProcessKey, list] = defaultdict(list)
        self._call_ops: dict[ProcessKey, dict[tuple, dict]] = defaultdict(dict)
        self._events: dict[str, list] = defaultdict(list)

    def now(self) -> int:
        return self.clock

    def gpus(self) -> list[str]:
        return sorted(set(self.models) | set(self._gpu) | set(self.profiles))

    def instances(self, gpu_id: str) -> dict[str, str]:
        return {instance: profile for instance, profile in
                sorted(self.profiles.get(gpu_id, {}).items(), key=lambda kv: mig_order(kv[0]))
                if self._gpu_instance.get((gpu_id, instance))}

    def gpu_model_name(self, gpu_id: str) -> str:
        return self.models.get(gpu_id, "")

    def gpu_numa_node(self, gpu_id: str) -> int | None:
        return self.numa_nodes.get(gpu_id)

    def processes(self, gpu_id: str) -> list[ProcessKey]:
        found = {p for p in self.bindings.get(gpu_id, {}) if p not in self.exited}
        if gpu_id in self.nvml_procs:
            found |= {p for p in self.nvml_procs[gpu_id][1] if p not in self.exited}
        return sorted(found)

    def process_list(self, gpu_id: str) -> list[ProcessKey] | None:
        listed = self.nvml_procs.get(gpu_id)
        if listed is None or listed[0] < self.clock - PROCESS_LIST_RECENT_NS:
            return None
        return sorted(p for p in listed[1] if p not in self.exited)

    def facts(self, process: ProcessKey) -> ProcessFacts | None:
        facts = self.process_facts.get(process)
        env = self.environ.get(process)
        if env is not None:
            facts = ProcessFacts(**{**(vars(facts) if facts else {}), "env": dict(env)})
        return facts

    def gpu_rows(self, gpu_id: str, start: int, end: int,
                 instance: str = "") -> list[tuple[int, Row]]:
        rows = self._gpu_instance.get((gpu_id, instance), ()) if instance else \
            self._gpu.get(gpu_id, ())
        return _slice(rows, start, end)

    def sched_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return _slice(self._sched.get(process, ()), start, end)

    def call_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return _slice(self._calls.get(process, ()), start, end)

    def cuda_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return _slice(self._cuda.get(process, ()), start, end)

    def engine_rows(self, process: ProcessKey, start: int, end: int) -> list[tuple[int, Row]]:
        return _slice(self._engine.get(process, ()), start, end)

    def event_rows(self, stream: str, scope: Scope, start: int,
                   end: int) -> list[tuple[int, dict]]:
        rows = _slice(self._events.get(stream, ()), start, end)
        if STREAMS[stream].scope != "gpu":
            return rows
        return [(ts, row) for ts, row in rows if row.get("_gpu") in (None, scope.gpu_id)]

    # Feeding.
    def feed(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add(event)

    def _append(self, buffer: list, ts: int, row: object) -> None:
        if buffer and buffer[-1][0] > ts:   # out of order: keep the buffer sorted
            buffer.insert(bisect.bisect_right(buffer, ts, key=_ts), (ts, row))
        else:
            buffer.append((ts, row))
        if buffer[0][0] < ts - self.retention_ns * 1.1:   # trim now and then, not every time
            del buffer[:bisect.bisect_left(buffer, ts - self.retention_ns, key=_ts)]

    def _event(self, stream: str, ts: int, row: dict) -> None:
        self._append(self._events[stream], ts, row)

    def add(self, event: Event) -> None:
        """Take one event; events of kinds rules do not read are ignored."""
        self.clock = max(self.clock, event.ts)
        ts = event.ts
        if isinstance(event, GpuSeen):
            self.models[event.gpu_id] = event.model
            if event.numa_node is not None:
                self.numa_nodes[event.gpu_id] = event.numa_node
            if event.pci_bus_id:
                self.pcis[pci_key(event.pci_bus_id)] = event.gpu_id
            if event.minor is not None:
                self.minors[event.minor] = event.gpu_id
        elif isinstance(event, GpuSample):
            if not event.instance:
                self._append(self._gpu[event.gpu_id], ts, dict(event.fields))
            else:          # a MIG instance's: its own series, never the whole GPU's
                self._append(self._gpu_instance[(event.gpu_id, event.instance)], ts,
                             dict(event.fields))
                known = self.profiles[event.gpu_id]
                known[event.instance] = event.labels.get("mig_profile") or \
                    known.get(event.instance, "")
        elif isinstance(event, GpuProcesses):
            keys = [ProcessKey(p["pid"], p["start_time"]) for p in event.processes
                    if p.get("start_time") is not None]
            self.nvml_procs[event.gpu_id] = (ts, keys)
        elif isinstance(event, (DeviceOpened, DriverCallStats)) and \
                (minor := using_gpu_minor(event)) is not None:
            gpu = self.minors.get(minor, GpuIdentity(minor=minor).id)
            self.bindings[gpu].setdefault(event.process, ts)
            if isinstance(event, DriverCallStats):
                self._calls_of(event, ts)
        elif isinstance(event, ProcessSeen):
            old = self.process_facts.get(event.process)
            self.process_facts[event.process] = ProcessFacts(
                comm=event.comm, cmdline=event.cmdline, exe=event.exe, cgroup=event.cgroup,
                first_seen=old.first_seen if old else ts,
                started_at=event.started_at if event.started_at is not None else
                old.started_at if old else None,
                # as the store keeps it: a sighting that read no environment keeps the known
                env=dict(event.env) if event.env else old.env if old else None)
        elif isinstance(event, ProcessExited):
            self.exited.add(event.process)
            facts = self.process_facts.get(event.process)
            if not is_monitor(facts):      # a GPU's processes only: one row per GPU
                for gpu, bound in self.bindings.items():
                    if event.process in bound:
                        self._event("proc.exit", ts, {
                            "_process": event.process, "_gpu": gpu,
                            "exit_code": event.exit_code, "signal": event.signal,
                            "comm": facts.comm if facts else ""})
        elif isinstance(event, ProcessExec):
            facts = self.process_facts.get(event.process)
            cmdline = facts.cmdline if facts else ""
            action = gpu_action(cmdline) or ""
            self._event("proc.exec", ts, {"_process": event.process,
                                          "filename": event.filename, "cmdline": cmdline,
                                          "comm": facts.comm if facts else "",
                                          "gpu_action": action, "reset": action_kind(action)})
        elif isinstance(event, SchedStats):
            row = {"interval_ns": event.interval_ns, "worker_processes": event.worker_processes,
                   "node_on_cpu_ns": event.node_on_cpu_ns}
            for side, figures in (("own", event.own), ("workers", event.workers),
                                  ("frontend", event.frontend or {}),
                                  ("engine_loop", event.engine_loop or {})):
                row.update({f"{side}_{k}": v for k, v in figures.items()})
            self._append(self._sched[event.process], ts, row)
        elif isinstance(event, DriverCallStats):
            self._calls_of(event, ts)
        elif isinstance(event, EngineSample):
            # the engine's process and each of its GPU processes read the same scrapes
            for key in dict.fromkeys([event.process, *event.processes]):
                if key is not None:
                    self._append(self._engine[key], ts, dict(event.values))
        elif isinstance(event, CudaStats):
            self._append(self._cuda[event.process], ts,
                         {"interval_ns": event.interval_ns, **event.totals()})
        elif isinstance(event, DriverCall):
            self._event("driver.call", ts, {
                "_process": event.process, "op": event.op, "sub_name": event.sub_name or "",
                "reasons": ",".join(event.reasons), "status": event.status_name,
                "ret": event.ret, "latency_ms": event.latency_ns / 1e6,
                "reset": reset_kind(event.sub_name)})
        elif isinstance(event, KernelLogRecord):
            logged = event.uuid or self._gpu_for_pci(event.pci)
            if event.record_kind == "xid":
                self._event("journal.xid", ts, {"_gpu": logged, "code": event.xid,
                                                "pid": event.pid, "name": event.name or "",
                                                "text": event.message})
            else:
                self._event("journal.nvrm", ts, {"_gpu": logged, "kind": event.record_kind,
                                                 "text": event.message})
        elif isinstance(event, GpuXid) and not event.before_start:
            # an Xid from before start has no time: a rule would count it as one just now
            self._event("gpu.xid", ts, {"_gpu": event.gpu_id, "code": event.xid,
                                        "text": event.detail})
        elif isinstance(event, GpuState):
            self._event("gpu.state", ts, {"_gpu": event.gpu_id, "state": event.state,
                                          "text": event.detail,
                                          "reset": state_kind(event.state)})
        elif isinstance(event, CronExecution):
            if event.phase == "started":
                self._event("cron.run", ts, {"command": event.command, "user": event.user,
                                             "gpu_action": event.gpu_action or "",
                                             "reset": action_kind(event.gpu_action)})

    def _calls_of(self, event: DriverCallStats, ts: int) -> None:
        # Cumulative per device path and operation; an event holds those that moved: the
        # process's totals add up every operation's latest figures.
        ops = self._call_ops[event.process]
        for op in event.ops:
            ops[(event.path, op["cmd"], op["sub"])] = op
        self._append(self._calls[event.process], ts, call_class_totals(list(ops.values())))

    def _gpu_for_pci(self, pci: str | None) -> str | None:
        return None if pci is None else self.pcis.get(pci_key(pci), pci)
