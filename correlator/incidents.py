"""The decide stage: turn stored events into incidents (deduplicated, open/closed, settling).

Runs inside the batch's transaction, after the writer applied the batch, on the same
connection: incidents and their chains commit with the events they rest on. Kinds:
``xid``, ``gpu_lost`` (fallen off the bus, Xid 79), ``gpu_reset`` (NVRM, the GPU source, or
the driver-call signature of a reset command), ``process_stall``, ``process_exit`` (death
after an Xid or reset) and ``rule_finding``.

One incident per cause: an effect (a process's stall or death, a rule finding, a later Xid
such as 45 on the same GPU) that begins while a cause incident (an Xid, a lost GPU, a reset)
of its GPU is active is kept as a row whose ``cause_id`` names that incident: a link of its
chain, never an incident, an alert or a count of its own. An effect found before its cause
(the kernel-log line came late) is adopted when the cause opens. Lifecycle
(:mod:`gpuwhy.lifecycle`): a health-backed incident (a lost GPU, an Xid whose catalogue
action is a reset or a reboot: :mod:`gpuwhy.store.health`) is open exactly while its GPU's
health is unusable, and is resolved by the very transition that ends that, at its time and
with its how (``reset``, ``reboot``, ``operator``, ``recovered`` for a loss only the source
said); any other is resolved when its GPU reads healthy again after it, its process ends,
its finding clears, or, for an incident that leaves the GPU healthy, ``dedup_seconds`` after
it was last seen (``timeout``), never before it settles. Every change goes through
:mod:`gpuwhy.store.incident_changes` (its log row), and the changes of incidents are handed to the
alerter for the journal (:attr:`changes`).

Decided as values from plain facts (no database; ``tests/correlator/test_incident_decide.py``):
the stall check (:func:`decide_stalls` on :func:`gpu_activity.stall_facts`), what ends with its
process or once settled (:func:`decide_exited`, :func:`decide_settled` on
:func:`incident_rows.settled_facts`), what a rule finding opens, joins, promotes or resolves
(:func:`decide_finding` on :func:`incident_rows.finding_facts`), whether a wanted incident
opens (and adopts or joins) or merges into, and reopens, the incident of its dedup key
(:func:`decide_open` on :func:`incident_rows.merge_facts`), a process's death
(:func:`decide_exit`), what GPU health's moves resolve (:func:`decide_health_moved`) and the
log lines of a moved answer (:func:`decide_answer_changes`); the builder applies them through
the store (:func:`incident_changes.resolve_decided`, :func:`incident_rows.insert_incident`,
:func:`incident_rows.merge_repeat`, ...). The Xid and reset detectors still read their cause
(:func:`cause_among`, :func:`incident_rows.needing_reset`) as they build what they want.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlite_utils import Database

from gpuwhy import gpu_health as gh
from gpuwhy import lifecycle as lc
from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import Config
from gpuwhy.correlator import chains, timeline
from gpuwhy.correlator.busy import LastBusy
from gpuwhy.correlator.health_machine import GpuHealth
from gpuwhy.correlator.pending import Alignment
from gpuwhy.correlator.rules.signals import names_a_monitor
from gpuwhy.events import (
    EVENT_TYPES,
    DriverCall,
    DriverGpu,
    Envelope,
    Event,
    GpuSeen,
    GpuState,
    GpuXid,
    KernelLogRecord,
    ProcessExited,
    RuleFinding,
    methods_by_kind,
)
from gpuwhy.identity import GpuIdentity, ProcessKey, mig_instance_name
from gpuwhy.reset import NEEDED_STATES, RESET_STATES, reset_kind, state_kind
from gpuwhy.rules import answer
from gpuwhy.rules.model import CAUSE, SYMPTOM
from gpuwhy.store import (
    gpu_activity,
    gpu_bindings,
    gpu_identity,
    incident_rows,
    process_seconds,
    queries,
)
from gpuwhy.store import health as store_health
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.gpu_activity import GpuIdle, StallFacts
from gpuwhy.store.gpu_identity import resolve_gpu
from gpuwhy.store.incident_rows import FindingFacts, MergeFacts, SettledCause
from gpuwhy.xid import catalogue_fields, xid_info

log = logging.getLogger(__name__)

CAUSE_KINDS = ("xid", "gpu_lost", "gpu_reset")
ADOPTED_KINDS = ("process_stall", "process_exit", "rule_finding")   # found before their cause
ACTOR = "gpuwhy"                         # who made a change, in the incident log
# GPU health while which a cause incident stays active: the GPU still needs what it said
UNRESOLVED_HEALTH = gh.UNUSABLE
FOLLOW_ON_XIDS = (45,)                   # "preemptive cleanup, due to previous errors"
EACH_ONE_ITS_OWN = ("gpu_reset",)        # repeats are new incidents past dedup_seconds
SILENT_STATES = NEEDED_STATES + RESET_STATES
EXIT_WINDOW_NS = 60 * NS_PER_SECOND      # a death this soon after an Xid/reset is its effect


# The kinds may_open_incident may say yes to: the correlator asks it only about these.
MAY_OPEN_KINDS = frozenset({"gpu_xid", "rule_finding", "gpu_state", "kernel_log_record",
                            "driver_call"})


def may_open_incident(event: Event) -> bool:
    """An event a detector below may open an incident on (keep in step with them): the
    correlator writes its batch at once instead of on the batch timer, so the alert is not
    held back. Process deaths and stalls follow such an event, or are found on the timer."""
    if isinstance(event, GpuXid):
        return not event.before_start          # see _detect_gpu_xid
    if isinstance(event, RuleFinding):
        return True
    if isinstance(event, GpuState):
        return event.state == "lost" or state_kind(event.state) == "reset"
    if isinstance(event, KernelLogRecord):
        return event.record_kind in ("xid", "fallen_off_bus")
    if isinstance(event, DriverCall):
        return reset_kind(event.sub_name) == "reset"
    return False


@dataclass
class Opened:
    """What a detector asks for; ``dedup_key`` merges repeats into one incident."""

    kind: str
    severity: str
    ts: int
    title: str
    summary: str
    dedup_key: str
    gpu_id: str | None = None
    process: ProcessKey | None = None
    details: dict[str, Any] = field(default_factory=dict)
    cause_id: int | None = None     # an effect of this incident: a link of its chain


@dataclass(frozen=True)
class Merge:
    """A repeat merged into its incident (:func:`decide_open`): ``count``, the (worst)
    ``severity``, seen at ``ts``, settling until ``settle_until``; ``reopened``, the log's
    line when it was resolved within the reopen window (None: it is active); ``details``,
    what its details become (None: unchanged: a reset or reboot it now asks for, the
    processes it now names); ``named_new``, one of those is new (its chain is rebuilt);
    ``named_full``, it names as many as it keeps (its later repeats read nothing more)."""

    incident_id: int
    count: int
    severity: str
    ts: int
    settle_until: int
    reopened: str | None = None
    details: dict[str, Any] | None = None
    named_new: bool = False
    named_full: bool = False


@dataclass(frozen=True)
class Insert:
    """A new incident (:func:`decide_open`): its ``row``; a cause adopts the effects of its
    GPU found before it, opened in ``adopt`` (since, until); an effect ``joins`` its cause
    (cause id, ts, the cause's settling until)."""

    row: dict[str, Any]
    adopt: tuple[int, int] | None = None
    joins: tuple[int, int, int] | None = None


OpenDecision = Merge | Insert


@dataclass(frozen=True)
class AnswerMove:
    """A GPU whose answer's lead finding changed (:func:`answer_moves`): its ``label``, the
    new lead (finding id, title), the one before (None: nothing led)."""

    label: str
    lead: tuple[str, str]
    before: tuple[str, str] | None


@dataclass(frozen=True)
class LogLine:
    """A line in an incident's log (``action``: a :mod:`gpuwhy.lifecycle` action) at ``ts``."""

    incident_id: int
    action: str
    ts: int
    text: str


@dataclass(frozen=True)
class Resolve:
    """Resolve an active incident, and its active effects with it, at ``ts``: ``how`` (a
    :mod:`gpuwhy.lifecycle` resolution), ``why`` (its log row's text)."""

    incident_id: int
    how: str
    ts: int
    why: str


@dataclass(frozen=True)
class SeenAt:
    """An incident seen again at ``ts`` (its ``last_seen``): an ongoing stall's, a cleared
    finding's (then resolved)."""

    incident_id: int
    ts: int


@dataclass(frozen=True)
class NewStall:
    """A bound process whose GPU has been near idle since ``idle_since``, long enough, with
    no active stall incident yet: one opens (:func:`stall_opened`) once its scheduler
    totals over the stretch and its cause are read."""

    process: ProcessKey
    gpu_id: str
    idle_since: int
    dedup_key: str


StallDecision = Resolve | SeenAt | NewStall


@dataclass(frozen=True)
class FindingAgain:
    """A firing finding seen again: its incident's (worst) severity, last seen, settling."""

    incident_id: int
    severity: str
    ts: int
    settle_until: int


@dataclass(frozen=True)
class Promote:
    """A cause that explains an open symptom incident becomes that incident's answer:
    ``answer``, its fields (:func:`incident_rows.answer_symptom`); the symptom is kept as a
    link under ``symptom_key``, and so are ``others``; ``text``, the log's line at ``ts``."""

    incident_id: int
    symptom_key: str
    answer: dict[str, Any]
    others: tuple[int, ...]
    ts: int
    text: str


FindingDecision = SeenAt | Resolve | FindingAgain | Promote | Opened


class IncidentBuilder:
    """Detectors per event kind, stall checks on the watermark, chain (re)building."""

    def __init__(self, config: Config, host_boot: str | None = None):
        self.lag_ns = int(config["correlator.lag_seconds"] * NS_PER_SECOND)
        self.stall_ns = int(config["correlator.stall_seconds"] * NS_PER_SECOND)
        self.stall_util = float(config["correlator.stall_util_pct"])
        self.dedup_ns = int(config["correlator.dedup_seconds"] * NS_PER_SECOND)
        self.reopen_ns = int(config["correlator.reopen_seconds"] * NS_PER_SECOND)
        self.alignment = Alignment(config["correlator.lag_seconds"],
                                   config["correlator.pending_max"])
        self.timelines = timeline.TimelineBuilder()
        self.opened = 0
        self.merged = 0
        self._named_full: set[int] = set()   # Xid incidents that name chains.MAX_NAMED already
        self._next_stall_check = 0
        self._detectors = methods_by_kind(self, "_detect_")
        # the GPU health state machine, fed each event; ``host_boot``: the host's boot id
        # (gpuwhy.boot), read by the application: the decide stage reads no /proc
        self.health = GpuHealth(host_boot)
        self.last_busy = LastBusy(self.stall_util)   # each GPU's, for the stall check
        # incident_log ids of the lifecycle changes of incidents (not of effects) the last
        # decide made, for the journal once its transaction commits
        self.changes: list[int] = []
        self._realert: list[int] = []       # incidents whose answer changed: alerted again
        # The finding that leads each GPU's answer (gpuwhy.rules.answer.verdicts), as of the
        # last decide that moved a finding or a health state: its change is logged
        self._leads: dict[str, tuple[str, str] | None] = {}
        self._answers_moved = False
        self.resolved = 0
        self.reopened = 0

    # --- the stage -------------------------------------------------------------------------
    def decide(self, db: Database, envelopes: list[Envelope],
               wall_ns: int | None = None) -> list[int]:
        """Detect, deduplicate, rebuild settling chains; returns the ids of new incidents.
        ``wall_ns``: the wall clock when running live (None: event time only, for replays)."""
        now = self.alignment.observe(envelopes, wall_ns)
        new: list[int] = []
        self.changes = []                   # a failed decide's were rolled back with it
        self._realert = []
        self._answers_moved = False
        self.timelines.discard_pending()    # held by a decide that failed: rolled back with it
        self.health.forget()
        if envelopes:
            self.health.first_seen(db, envelopes[0].event.ts)
            self._health_moved(db)          # a reboot seen at start clears states
        routes = self._route_table()        # per decide: a part may have been replaced
        for envelope in envelopes:
            event = envelope.event
            route = routes.get(event.kind)
            if route is None:
                continue                    # a kind no part of the stage reads
            handlers, detector = route
            for handler in handlers:
                handler(db, event)
            if detector is None:
                continue
            self.health.forget()            # a detector may merge GPU rows (gpu_identity.learn)
            for wanted in detector(db, event) or ():
                incident_id, created = self._open(db, wanted)
                if created and wanted.cause_id is None:
                    new.append(incident_id)
        self.timelines.write_pending(db)    # before the stall checks and chains read the store
        if now >= self._next_stall_check:
            for wanted in self._stalls(db, now):
                incident_id, created = self._open(db, wanted)
                if created and wanted.cause_id is None:
                    new.append(incident_id)
            self._next_stall_check = now + NS_PER_SECOND // 2
        for incident_id in self.alignment.settling(db):
            chains.rebuild(db, incident_id)
        self._resolve_exited(db, now)
        self._resolve_settled(db, now)
        if self._answers_moved:     # live: the store's now (its firing rows, indexed)
            self._log_answer_changes(db, now, None if wall_ns is not None else now)
        new += [i for i in self._realert if i not in new]
        return new

    def _log_answer_changes(self, db: Database, now: int, at: int | None) -> None:
        """A line in the incidents' logs when the finding that leads a GPU's answer changes
        (the answer `gpuwhy why` gives, read from what this decide stored): "now the answer
        on GPU 2 (was: ...)" in the new lead's incident, "no longer the answer" in the old
        one's. Not at the first look after a start (nothing to compare with), not for a
        cause that became its symptom's incident's answer here (logged as such).
        :func:`answer_moves`, then :func:`decide_answer_changes` on the incidents they name."""
        moves, self._leads = answer_moves(queries.gpu_verdicts(db, {}, at=at), self._leads)
        held = []
        for move in moves:
            row = incident_rows.active_by_key(db, f"rule_finding:{move.lead[0]}")
            old = incident_rows.active_by_key(db, f"rule_finding:{move.before[0]}") \
                if move.before else None
            held.append((move, row[0] if row is not None else None,
                         old[0] if old is not None else None,
                         old is not None and incident_rows.is_cause(db, old[0])))
        for line in decide_answer_changes(held, self._realert, now):
            self._logged(db, line.incident_id, line.action, line.ts, text=line.text)

    def _route_table(self) -> dict[str, tuple[tuple[Callable[[Database, Any], None], ...],
                                                 Any]]:
        """Per kind, who reads its events: the handlers each one is fed (the timelines, GPU
        health, the stall check's busy samples), and its detector. A kind none reads (most of
        a busy batch's device opens and closes) costs the decide loop one lookup."""
        table: dict[str, tuple[tuple[Callable[[Database, Any], None], ...], Any]] = {}
        for kind in EVENT_TYPES:
            handlers = tuple(handler for handler in (
                self.timelines.handler(kind),
                self._observe_health if self.health.handles(kind) else None,
                self.last_busy.observe if kind == "gpu_sample" else None) if handler)
            detector = self._detectors.get(kind)
            if handlers or detector:
                table[kind] = (handlers, detector)
        return table

    def _observe_health(self, db: Database, event: Event) -> None:
        self.health.observe(db, event)
        self._health_moved(db)

    def _health_moved(self, db: Database) -> None:
        """Apply what the GPU health machine just decided to the incidents resting on it: a
        transition that makes an unusable GPU usable resolves its health-backed incidents
        at once, dated at it and with its how, so that they never disagree; a source that
        contradicts a lost GPU is kept on its incidents and shown in their chains
        (:func:`decide_health_moved`, on each GPU's active health-backed incidents)."""
        if not (self.health.transitions or self.health.contradicted):
            return                          # the common case: a sample that moved nothing
        moved, contradicted = self.health.take()
        self._answers_moved = self._answers_moved or bool(moved)
        gpus = {move.gpu_id for move in moved if move.leaves_unusable} | \
            {gpu_id for gpu_id, _ in contradicted}
        held = {gpu_id: store_health.active_health_incidents(db, gpu_id)
                for gpu_id in sorted(gpus)}
        resolved, noted = decide_health_moved(moved, contradicted, held)
        self._apply(db, resolved)
        for incident_id, seen in noted:
            store_health.note_incident_contradiction(db, incident_id, seen)
            chains.rebuild(db, incident_id)

    def counters(self) -> dict[str, int]:
        return {"incidents_opened": self.opened, "incidents_merged": self.merged,
                "incidents_resolved": self.resolved, "incidents_reopened": self.reopened,
                **self.alignment.counters()}

    def settle_ns(self, kind: str) -> int:
        """How long an incident of ``kind`` takes in late events and effects after its last."""
        effects = self.stall_ns + 3 * NS_PER_SECOND if kind in CAUSE_KINDS else 0
        return self.lag_ns + effects

    def _open(self, db: Database, wanted: Opened) -> tuple[int, bool]:
        """Merge ``wanted`` into its incident or insert it (:func:`decide_open`, from the
        rows :func:`incident_rows.merge_facts` reads); returns (id, inserted)."""
        active_only, since = merge_window(wanted.kind, wanted.ts, self.dedup_ns,
                                          self.reopen_ns)
        facts = incident_rows.merge_facts(db, wanted.dedup_key, active_only, since,
                                          asks_health(wanted.details),
                                          bool(wanted.details.get("named")), self._named_full)
        decision = decide_open(wanted, facts, self.settle_ns(wanted.kind), self.lag_ns)
        if isinstance(decision, Merge):
            self._merged(db, decision)
            return decision.incident_id, False
        return self._inserted(db, decision), True

    def _merged(self, db: Database, merge: Merge) -> None:
        """Apply a :class:`Merge`: reopen the incident (its log says so), count the repeat,
        write what its details gained, rebuild its chain when it names a new process."""
        incident_id = merge.incident_id
        if merge.reopened is not None:
            store_lifecycle.mark_reopened(db, incident_id, merge.ts)
            self._logged(db, incident_id, lc.REOPENED, merge.ts, text=merge.reopened)
            self.reopened += 1
        if merge.details is not None:
            incident_rows.set_details(db, incident_id, merge.details)
        incident_rows.merge_repeat(db, incident_id, merge.count, merge.severity, merge.ts,
                                   merge.settle_until)
        self.merged += 1
        if merge.named_full:
            self._named_full.add(incident_id)
        if merge.named_new:
            chains.rebuild(db, incident_id)

    def _inserted(self, db: Database, insert: Insert) -> int:
        """Apply an :class:`Insert`: the row and its log's first line; a cause adopts the
        effects found before it (they were counted as incidents: they are its links), an
        effect's cause is updated and its chain rebuilt; the new chain. Returns its id."""
        row = insert.row
        incident_id = incident_rows.insert_incident(db, row)
        store_lifecycle.log_change(db, incident_id, lc.OPENED, row["opened_at"], ACTOR)
        if insert.joins is None:
            self.opened += 1
            if insert.adopt is not None:
                self.opened -= incident_rows.adopt_effects(
                    db, incident_id, row["gpu_id"], ADOPTED_KINDS, *insert.adopt)
        else:
            cause_id, ts, settle_until = insert.joins
            incident_rows.effect_joined(db, cause_id, ts, settle_until)
            chains.rebuild(db, cause_id)
        chains.rebuild(db, incident_id)
        return incident_id

    # --- one incident per cause ------------------------------------------------------------
    def _cause_of(self, db: Database, gpu_id: str | None, ts: int,
                  kinds: tuple[str, ...] = CAUSE_KINDS,
                  process: ProcessKey | None = None) -> int | None:
        """The active cause incident of ``gpu_id`` that an effect beginning at ``ts`` belongs
        to (:func:`cause_among` its GPU's active causes of ``kinds``)."""
        if gpu_id is None:
            return None
        return cause_among(incident_rows.active_causes(db, gpu_id, kinds, ts), ts, process,
                           self._settles())

    def _settles(self) -> dict[str, int]:
        """:meth:`settle_ns` of each cause kind."""
        return {kind: self.settle_ns(kind) for kind in CAUSE_KINDS}

    # --- lifecycle -------------------------------------------------------------------------
    def _logged(self, db: Database, incident_id: int, action: str, ts: int,
                resolution: str | None = None, text: str | None = None) -> None:
        change = store_lifecycle.log_change(db, incident_id, action, ts, ACTOR, resolution,
                                            text)
        # effects are links: their changes are not news; a new answer is alerted again whole
        if incident_rows.is_cause(db, incident_id) and action != lc.ANSWERED:
            self.changes.append(change)

    def _resolve(self, db: Database, incident_id: int, how: str, ts: int, why: str) -> None:
        """Resolve an active incident and its active effects (they end with their cause; a
        cause is not resolved while a process it stalled is still stalled)."""
        change = store_lifecycle.resolve_decided(db, incident_id, how, ts, why, ACTOR)
        if change is not None:              # effects are links: their changes are not news
            self.changes.append(change)
        self.resolved += 1

    def _apply(self, db: Database, decisions: Sequence[Resolve]) -> None:
        for decision in decisions:
            self._resolve(db, decision.incident_id, decision.how, decision.ts, decision.why)

    def _resolve_exited(self, db: Database, now: int) -> None:
        """Stalls, and settled Xids that name a process, end when their process does."""
        self._apply(db, decide_exited(incident_rows.ended_with_process(db, now)))

    def _resolve_settled(self, db: Database, now: int) -> None:
        """Cause incidents, once settled: resolved when their GPU reads healthy again after
        them, or (if they never left it unhealthy) ``dedup_seconds`` after last seen."""
        facts = incident_rows.settled_facts(db, now, gh.OK, UNRESOLVED_HEALTH)
        self._apply(db, decide_settled(facts, now, self.dedup_ns))

    # --- detectors -------------------------------------------------------------------------
    def _xid(self, db: Database, ts: int, gpu_id: str | None, code: int, pid: int | None,
             name: str | None, origin: str, detail: str,
             fields: dict[str, Any] | None = None) -> list[Opened]:
        """``fields``: the catalogue fields as the line itself decided them (an Xid 154's new
        recovery action, an NVLink5 Xid's decoded status), the same ones GPU health used,
        so that the incident rests on what the health state does; else the code's entry."""
        process = gpu_bindings.process_with_pid_at(db, pid, ts) if pid else None
        # A later Xid of a GPU that is off the bus, or one that follows a previous Xid (45),
        # is that incident's effect; a lost GPU is a cause of its own, whatever came before.
        cause = None
        if code != 79:
            cause = self._cause_of(db, gpu_id, ts, ("gpu_lost",))
            if cause is None and code in FOLLOW_ON_XIDS:
                cause = self._cause_of(db, gpu_id, ts, ("xid", "gpu_lost"))
        return [xid_opened(ts, gpu_id, code, pid, name, origin, detail, fields, process, cause)]

    def _detect_kernel_log_record(self, db: Database, event: KernelLogRecord) -> list[Opened]:
        gpu_id = resolve_gpu(db, uuid=event.uuid, pci=event.pci)
        if event.record_kind == "xid" and event.xid is not None:
            return self._xid(db, event.ts, gpu_id, event.xid, event.pid, event.name,
                             f"kernel log ({event.origin})", event.message,
                             catalogue_fields("xid", event.xid, event.details))
        if event.record_kind == "fallen_off_bus":
            return self._xid(db, event.ts, gpu_id, 79, None, None,
                             f"kernel log ({event.origin})", event.message)
        if event.record_kind == "gpu_uuid" and event.pci and event.uuid:
            gpu_identity.learn(db, GpuIdentity(uuid=event.uuid, pci_bus_id=event.pci), event.ts)
        return []

    def _detect_gpu_seen(self, db: Database, event: GpuSeen) -> list[Opened]:
        gpu_identity.learn(db, GpuIdentity(uuid=event.uuid, pci_bus_id=event.pci_bus_id,
                                       index=event.index, minor=event.minor), event.ts)
        return []

    def _detect_driver_gpu(self, db: Database, event: DriverGpu) -> list[Opened]:
        # The driver's own table, published by the GPU source (probes/gpu/source.py): the
        # minor a device file names and the bus id a kernel-log line names lead to its UUID.
        gpu_identity.learn(db, GpuIdentity(uuid=event.uuid, pci_bus_id=event.pci_bus_id,
                                           minor=event.minor), event.ts)
        return []

    def _detect_gpu_xid(self, db: Database, event: GpuXid) -> list[Opened]:
        if event.before_start:
            # An Xid from before gpuwhy started, time unknown (dcgm-exporter's gauge at the
            # first scrape): an incident would be dated now and alert as if it just happened.
            # It stays a stored event and a note on the GPU page; GPU health may use it.
            return []
        return self._xid(db, event.ts, event.gpu_id, event.xid, None, None,
                         f"GPU source {event.source}", event.detail)

    def _detect_gpu_state(self, db: Database, event: GpuState) -> list[Opened]:
        if event.state == "lost":
            return self._xid(db, event.ts, event.gpu_id, 79, None, None,
                             f"GPU source {event.source}", event.detail)
        if state_kind(event.state) == "reset":   # needed: the Xid behind it is the incident
            return [self._reset(db, event.gpu_id, event.ts, f"GPU source {event.source}: "
                                f"{event.state}", {"detail": event.detail})]
        return []

    def _reset(self, db: Database, gpu_id: str | None, ts: int, how: str,
               details: dict) -> Opened:
        return reset_opened(gpu_id, ts, how, details, self._needed_reset_of(db, gpu_id, ts))

    def _needed_reset_of(self, db: Database, gpu_id: str | None, ts: int) -> int | None:
        """The active incident of ``gpu_id`` that needs a reset (lost; an Xid whose
        catalogue action is a reset or a reboot), if one opened before ``ts``."""
        if gpu_id is None:
            return None
        return incident_rows.needing_reset(db, gpu_id, ts)

    def _detect_driver_call(self, db: Database, event: DriverCall) -> list[Opened]:
        if reset_kind(event.sub_name) != "reset":   # a request: the reset call follows
            return []
        key = event.process
        minor = _minor_of(event.path)
        gpus = [resolve_gpu(db, minor=minor)] if minor is not None else \
            gpu_bindings.gpus_of(db, key, event.ts)
        return [self._reset(db, gpu, event.ts, f"{event.sub_name} by pid {key.pid}",
                            {"pid": key.pid, "start_time": key.start_time,
                             "path": event.path}) for gpu in gpus or [None]]

    def _detect_process_exited(self, db: Database, event: ProcessExited) -> list[Opened]:
        """A death soon after an Xid or a reset on a GPU its process held
        (:func:`decide_exit`, on the latest cause opened on each of them)."""
        if event.exit_code == 0 and not event.signal:
            return []                       # a clean exit is not a death
        causes = [(gpu_id, incident_rows.latest_cause_opened(
            db, gpu_id, event.ts - EXIT_WINDOW_NS, event.ts))
            for gpu_id in set(gpu_bindings.gpus_of(db, event.process, event.ts - 1))]
        return decide_exit(event, causes)

    def _detect_rule_finding(self, db: Database, event: RuleFinding) -> list[Opened]:
        """A firing finding opens (or, on a severity change, updates) its incident, joins the
        active cause incident of its GPU as a link, or becomes the answer of the symptom
        incident it explains; a cleared one resolves it (:func:`decide_finding`, from the
        rows :func:`incident_rows.finding_facts` reads). Shadow findings are the rules' own
        business: no incident, no alert."""
        if event.shadow:
            return []
        self._answers_moved = True
        facts = incident_rows.finding_facts(
            db, finding_key(event), event.state != "cleared", event.gpu_id,
            event.since or event.ts, CAUSE_KINDS, finding_reads(event))
        found: list[Opened] = []
        for decision in decide_finding(event, facts, self.lag_ns, self._settles()):
            if isinstance(decision, SeenAt):
                incident_rows.seen_at(db, decision.incident_id, decision.ts)
            elif isinstance(decision, Resolve):
                self._apply(db, [decision])
            elif isinstance(decision, FindingAgain):
                incident_rows.finding_again(db, decision.incident_id, decision.severity,
                                            decision.ts, decision.settle_until)
            elif isinstance(decision, Promote):
                self._promoted(db, decision)
            else:
                found.append(decision)
        return found

    def _promoted(self, db: Database, promote: Promote) -> None:
        """Apply a :class:`Promote`: the symptom incident takes the cause (its id stays: the
        link in the first alert still leads to it), its chain is rebuilt, and the alert goes
        out again with the cause."""
        incident_rows.answer_symptom(db, promote.incident_id, promote.symptom_key,
                                     promote.answer, list(promote.others))
        self._logged(db, promote.incident_id, lc.ANSWERED, promote.ts, text=promote.text)
        chains.rebuild(db, promote.incident_id)
        self._realert.append(promote.incident_id)

    # --- stalls ----------------------------------------------------------------------------
    def _stalls(self, db: Database, now: int) -> list[Opened]:
        """Bound, living processes whose GPU has been near idle (or silent while resetting or
        lost) for ``stall_seconds`` after being busy (:func:`decide_stalls`, from the facts
        :func:`gpu_activity.stall_facts` reads). Not a monitor (nv-hostengine, an NVML
        exporter, gpuwhy): it holds the device files and waits whatever the GPU does."""
        facts = gpu_activity.stall_facts(
            db, now, lambda gpu_id, since, until: self.last_busy.latest(db, gpu_id, since,
                                                                         until),
            names_a_monitor, SILENT_STATES)
        found: list[Opened] = []
        for decision in decide_stalls(facts, self.stall_ns):
            if isinstance(decision, Resolve):
                self._apply(db, [decision])
            elif isinstance(decision, SeenAt):
                incident_rows.seen_at(db, decision.incident_id, decision.ts)
            else:
                key, since = decision.process, decision.idle_since
                how = timeline.classify_stall(process_seconds.sched_totals(db, key, since,
                                                                           now))
                found.append(stall_opened(decision, now, how, self._cause_of(
                    db, decision.gpu_id, since, process=key)))
        return found


# --- the decisions, from plain facts -----------------------------------------------------------
def idle_start(idle: GpuIdle, now: int) -> int | None:
    """Where a GPU's idle stretch began after its busy sample (``idle.busy``), if it did: the
    first of its next sample, when it went silent (a GPU source said resetting or lost; else
    its state now is such, since then) and when its health said lost or resetting by
    ``now`` (an Xid 79 in the kernel log, where no GPU source said so). A GPU that went
    silent after its last busy sample was idle from then, even if it has come back since."""
    busy, state = idle.busy, idle.state
    went_silent = None
    if state and state[1] and state[1] > busy:      # its state changed since: how?
        went_silent = idle.went_silent
        if went_silent is None and state[0] in SILENT_STATES:
            went_silent = state[1]
    lost = state[3] if state and state[2] in (gh.LOST, gh.RESETTING) and state[3] and \
        busy < state[3] <= now else None
    starts = [t for t in (idle.first_sample, went_silent, lost) if t is not None]
    return min(starts) if starts else None


def decide_stalls(facts: StallFacts, stall_ns: int) -> list[StallDecision]:
    """The stall check at ``facts.now``, in the bound processes' order: a process whose GPU
    is busy again ends its stall incidents opened before now (:class:`Resolve`); one whose GPU
    has been idle for ``stall_ns`` since being busy after it bound it (a process that never
    saw it busy did not stall) is still stalled (:class:`SeenAt`: each of its active stall
    incidents opened by now) or stalls (:class:`NewStall`)."""
    now = facts.now
    stalled_now: dict[str, list[tuple[int, int]]] = {}
    for stalled, dedup_key, opened_at in facts.stalls:
        stalled_now.setdefault(dedup_key, []).append((stalled, opened_at))
    decided: list[StallDecision] = []
    ended: set[int] = set()     # resolved by a decision above (a process bound twice)
    for bound in facts.bound:
        key, gpu_id = bound.process, bound.gpu_id
        dedup_key = f"process_stall:{key}:{gpu_id}"
        idle_since = None if bound.busy is None else \
            idle_start(facts.idle[(gpu_id, bound.busy)], now)
        mine = sorted(stalled_now.get(dedup_key, ()))
        if idle_since is None or now - idle_since < stall_ns:
            if idle_since is None:      # busy again: the stall is over
                over = [stalled for stalled, opened_at in mine if opened_at < now]
                decided += [Resolve(stalled, lc.RECOVERED, now, "the GPU is busy again")
                            for stalled in over]
                ended.update(over)
            continue
        seen = [stalled for stalled, opened_at in mine if opened_at <= now]
        if seen:
            decided += [SeenAt(stalled, now) for stalled in seen if stalled not in ended]
            continue
        decided.append(NewStall(key, gpu_id, idle_since, dedup_key))
    return decided


def merge_window(kind: str, ts: int, dedup_ns: int, reopen_ns: int) -> tuple[bool, int]:
    """Which incident a wanted one of ``kind`` at ``ts`` merges into (``active_only``,
    ``since``, for :func:`incident_rows.merge_facts`): each reset is an event of its own, the
    same reset only within ``dedup_ns`` of the last seen of an active one, and never
    reopens; any other kind merges into its active incident or reopens one resolved within
    ``reopen_ns`` (an effect whose cause was resolved is not reopened: a repeat is news
    again)."""
    if kind in EACH_ONE_ITS_OWN:
        return True, ts - dedup_ns
    return False, ts - reopen_ns


def asks_health(details: Mapping[str, Any]) -> bool:
    """A wanted incident that asks for a reset or a reboot (its catalogue action)."""
    return bool(details.get("gpu_reset") or details.get("reboot"))


def decide_open(wanted: Opened, facts: MergeFacts, settle_ns: int,
                lag_ns: int) -> OpenDecision:
    """What a wanted incident does (``facts``: :func:`incident_rows.merge_facts` for its
    :func:`merge_window`): a repeat merges into the incident of its dedup key
    (:class:`Merge`: counted, its worst severity, seen and settling ``settle_ns`` after it,
    reopened if it was resolved, its details gaining what :func:`merged_details` says);
    else it is a new incident (:class:`Insert`) that settles ``settle_ns`` after it: a cause
    adopts its GPU's effects begun within that time, an effect joins its cause, which
    settles ``lag_ns`` after it at least."""
    ts = wanted.ts
    settle = ts + settle_ns
    if facts.row:
        incident_id, count, severity, state = facts.row
        details, named_new, named_full = merged_details(facts.details, wanted.details,
                                                        facts.named_full)
        # a resolved incident of the same cause again is open again, not a new one (a stall
        # merged into while left resolved was found again at every check)
        return Merge(incident_id, count + 1, sev.worst([severity, wanted.severity]), ts,
                     settle, f"seen again: {wanted.summary}"[:lc.NOTE_MAX]
                     if state == lc.RESOLVED else None, details, named_new, named_full)
    process = wanted.process
    row = {
        "opened_at": ts, "closed_at": None, "kind": wanted.kind,
        "severity": sev.worst([wanted.severity]), "gpu_id": wanted.gpu_id,
        "pid": process.pid if process else None,
        "start_time": process.start_time if process else None,
        "title": wanted.title, "summary": wanted.summary, "chain": "[]",
        "dedup_key": wanted.dedup_key, "count": 1, "last_seen": ts,
        "state": lc.OPEN, "settle_until": settle, "updated_at": ts,
        "confidence": None, "details": json.dumps(wanted.details, sort_keys=True),
        "cause_id": wanted.cause_id,
    }
    if wanted.cause_id is not None:
        return Insert(row, joins=(wanted.cause_id, ts, ts + lag_ns))
    return Insert(row, adopt=(ts, settle) if wanted.kind in CAUSE_KINDS else None)


def merged_details(held: Mapping[str, Any] | None, wanted: Mapping[str, Any],
                   named_full: bool) -> tuple[dict[str, Any] | None, bool, bool]:
    """What a merged repeat adds to its incident's details (``held``, as stored; read when
    the repeat may add to them): (the details now, None when unchanged; whether a process
    it names is new; whether the incident names as many as it keeps, ``named_full`` as
    known before). A repeat that asks for a reset or a reboot its incident did not (an Xid
    154 whose new recovery action is a reboot, merged into one that said none) makes the
    incident rest on the GPU's health, as the health state does. The processes a repeat
    names (an Xid line's pid and name) join those the incident names, up to
    chains.MAX_NAMED: two programs faulting on one GPU are one Xid incident, and both are
    its story; a storm of thousands names its first few (the incident's count says how many
    lines there were), and once it names that many its lines read nothing more."""
    details = dict(held or {})
    changed = False
    if asks_health(wanted):
        flags = {flag: True for flag in ("gpu_reset", "reboot")
                 if wanted.get(flag) and not details.get(flag)}
        if flags:
            details.update(flags)
            changed = True
    named = wanted.get("named") or []
    if not named or named_full:
        return (details if changed else None), False, named_full
    known = list(details.get("named", []))
    pids = {n[0] for n in known}
    new = [n for n in named if n[0] not in pids][:chains.MAX_NAMED - len(known)]
    if new:
        details["named"] = known + new
        changed = True
    return (details if changed else None), bool(new), len(known) + len(new) >= chains.MAX_NAMED


def decide_health_moved(moved: Sequence[gh.Transition],
                        contradicted: Sequence[tuple[str, dict[str, Any]]],
                        held: Mapping[str, Sequence[int]]
                        ) -> tuple[list[Resolve], list[tuple[int, dict[str, Any]]]]:
    """What the GPU health machine's decisions do to the incidents resting on it (``held``:
    each GPU's active health-backed incidents, oldest first, as read before): a transition
    that makes an unusable GPU usable resolves them at once, dated at it and with its how, so
    that they never disagree; a source that contradicts a lost GPU is noted on those still
    active (its chain shows it). Returns (resolutions, (incident, contradiction) notes)."""
    resolved: list[Resolve] = []
    ended: set[int] = set()
    for move in moved:
        if not move.leaves_unusable:
            continue
        how = gh.RESOLUTION[move.how or gh.BY_READ]
        for incident_id in held.get(move.gpu_id, ()):
            if incident_id not in ended:
                ended.add(incident_id)
                resolved.append(Resolve(incident_id, how, move.ts,
                                        f"GPU {move.gpu_id} {move.state} again: "
                                        f"{move.cause}"[:lc.NOTE_MAX]))
    noted = [(incident_id, seen) for gpu_id, seen in contradicted
             for incident_id in held.get(gpu_id, ()) if incident_id not in ended]
    return resolved, noted


def decide_exit(event: ProcessExited, causes: Sequence[tuple[str, tuple | None]]
                ) -> list[Opened]:
    """The deaths a process's unclean exit is (an effect, a link of its cause): on each GPU
    it held, the latest cause incident opened within ``EXIT_WINDOW_NS`` before it (``causes``:
    (GPU, row of :func:`incident_rows.latest_cause_opened`, or None)), but an Xid about
    another process (13, 31, 43) on a usable GPU, and a reset this process made."""
    key = event.process
    found = []
    for gpu_id, cause in causes:
        if cause is None:
            continue
        if cause[1] == "xid" and cause[4] is not None and cause[6] not in \
                UNRESOLVED_HEALTH and (cause[4], cause[5]) != (key.pid, key.start_time):
            continue                    # an Xid about another process (13, 31, 43)
        actor = json.loads(cause[3] or "{}")
        if (actor.get("pid"), actor.get("start_time")) == (key.pid, key.start_time):
            continue                    # the process that reset the GPU
        how = (f"killed by signal {event.signal}" if event.signal else
               f"exit code {event.exit_code}" if event.exit_code is not None else "ended")
        found.append(Opened("process_exit", "error", event.ts,
                            f"Process {key.pid} died after {cause[2]}",
                            f"pid {key.pid} on GPU {gpu_id} {how}",
                            f"process_exit:{key}", gpu_id, key,
                            {"cause_incident": cause[0], "exit_code": event.exit_code,
                             "signal": event.signal}, cause_id=cause[0]))
    return found


def answer_moves(verdicts: Sequence[answer.Verdict],
                 before: Mapping[str, tuple[str, str] | None]
                 ) -> tuple[list[AnswerMove], dict[str, tuple[str, str] | None]]:
    """The GPUs whose lead finding (the rule answer that leads, not the health state; finding
    id, title) changed to another since ``before`` (the leads as of the last look; a GPU not
    in it was not looked at: nothing to compare with), and the leads now."""
    leads: dict[str, tuple[str, str] | None] = {}
    moves = []
    for verdict in verdicts:
        gpu = verdict.gpu
        lead = verdict.lead.finding if verdict.lead and not verdict.health_leads else None
        leads[gpu.gpu_id] = (lead.finding_id, lead.title) if lead else None
        if gpu.gpu_id not in before or lead is None:
            continue
        was = before[gpu.gpu_id]
        if was is not None and was[0] == lead.finding_id:
            continue
        moves.append(AnswerMove(gpu.label, (lead.finding_id, lead.title), was))
    return moves, leads


def decide_answer_changes(moves: Sequence[tuple[AnswerMove, int | None, int | None, bool]],
                          realert: Collection[int], now: int) -> list[LogLine]:
    """The log lines of answers that moved (each move with the active incident of its new
    lead's finding, that of the old one's and whether that one is a cause): "now the answer
    on GPU 2 (was: ...)" in the new lead's incident, but one whose cause became its
    symptom's incident's answer here (``realert``: logged as such), "no longer the answer"
    in the old one's."""
    notes = []
    for move, incident, old, old_is_cause in moves:
        if incident is not None and incident not in realert:
            was = f" (was: {move.before[1]})" if move.before else ""
            notes.append(LogLine(incident, lc.ANSWERED, now,
                              f"now the answer on {move.label}{was}"[:lc.NOTE_MAX]))
        if old is not None and old_is_cause and (incident is None or old != incident):
            notes.append(LogLine(old, lc.NOTE, now,
                              f"no longer the answer on {move.label}: {move.lead[1]} "
                              f"ranks above it"[:lc.NOTE_MAX]))
    return notes


def xid_opened(ts: int, gpu_id: str | None, code: int, pid: int | None, name: str | None,
               origin: str, detail: str, fields: dict[str, Any] | None,
               process: ProcessKey | None, cause: int | None) -> Opened:
    """The incident an Xid line wants (a lost GPU's for 79): ``fields``, the catalogue
    fields as the line decided them (else the code's entry); ``process``, the process of
    ``pid`` as gpuwhy saw it; ``cause``, the active incident it is an effect of."""
    info = xid_info(code)
    fields = fields or info.as_fields()
    kind = "gpu_lost" if code == 79 else "xid"
    details = {"xid": code, "origin": origin, "pid": pid, "name": name, "detail": detail,
               **fields}
    if pid is not None:   # every process the driver names, as repeats merge in: its
        # start too where gpuwhy saw it (the probes did), so that it is the process's key
        details["named"] = [[pid, name, process.start_time if process else None]]
    return Opened(kind, str(fields.get("severity") or info.severity), ts,
                  f"Xid {code}: {info.title}",
                  f"GPU {gpu_id or '?'}: {fields.get('action') or info.action}",
                  f"{kind}:{gpu_id}:{code}", gpu_id, process, details, cause)


def reset_opened(gpu_id: str | None, ts: int, how: str, details: dict[str, Any],
                 needed: int | None) -> Opened:
    """The incident a reset wants, however it was seen (``how``). Wide dedup: the driver
    calls, the GPU source and NVRM all report the one reset. The reset a lost GPU or a
    reset-class Xid called for (``needed``: that incident) is its remedy, a link of it
    (which resolves it once the GPU reads healthy), not a new alert."""
    return Opened("gpu_reset", "critical", ts, "GPU reset",
                  f"GPU {gpu_id or '?'} was reset ({how}); its processes lost their "
                  f"contexts", f"gpu_reset:{gpu_id}", gpu_id, None,
                  {"seen_by": how, **details}, needed)


def stall_opened(stall: NewStall, now: int, how: str, cause_id: int | None) -> Opened:
    """The incident a new stall opens: ``how`` the process spent the stretch
    (:func:`timeline.classify_stall`), ``cause_id`` the active cause it belongs to."""
    pid, gpu_id, idle_since = stall.process.pid, stall.gpu_id, stall.idle_since
    return Opened("process_stall", "warning", idle_since,
                  f"Process {pid} stalled: GPU idle", f"pid {pid} alive but GPU {gpu_id} near "
                  f"idle for {(now - idle_since) / NS_PER_SECOND:.0f}s; process {how}",
                  stall.dedup_key, gpu_id, stall.process, {"classified": how}, cause_id)


def cause_among(rows: Sequence[tuple], ts: int, process: ProcessKey | None,
                settle: Mapping[str, int]) -> int | None:
    """The cause incident an effect beginning at ``ts`` belongs to, of its GPU's active
    causes opened at or before ``ts`` (rows of :func:`incident_rows.active_causes`: id, kind,
    last_seen, GPU health, pid, start_time; latest first): one seen within its settling time
    (``settle`` by kind) of it, or whose GPU still needs what it said (lost, reset or reboot
    required, resetting). An Xid that names a process (Xid 13, 31, 43) is the cause of that
    process's effects only, and of the GPU's own (a GPU-wide finding such as R36's, which
    reads that Xid): never of another process's."""
    for incident_id, kind, last_seen, health, pid, start_time in rows:
        if kind == "xid" and pid is not None and health not in UNRESOLVED_HEALTH and \
                process is not None and \
                (pid, start_time) != (process.pid, process.start_time):
            continue
        if ts <= last_seen + settle[kind] or health in UNRESOLVED_HEALTH:
            return cast(int, incident_id)
    return None


def finding_key(event: RuleFinding) -> str:
    """The dedup key of a finding's incident."""
    return f"rule_finding:{event.finding_id}"


def finding_reads(event: RuleFinding) -> tuple[str, ...]:
    """The kinds of the GPU's active findings a new incident of ``event`` is related to: a
    symptom's explaining causes, a cause's symptoms it may explain."""
    if event.rule_kind == SYMPTOM:
        return (CAUSE,)
    if event.rule_kind == CAUSE and event.explains:
        return (SYMPTOM,)
    return ()


def decide_finding(event: RuleFinding, facts: FindingFacts, lag_ns: int,
                   settle: Mapping[str, int]) -> list[FindingDecision]:
    """What a (not shadow) finding does to the incidents: a cleared one resolves its active
    incident; a firing one seen again updates it (an incident keeps the worst severity its
    finding reached, as a merged repeat does: a finding that calms down is still the
    incident it escalated to); a new one opens an incident dated when its condition first
    held (``since``, not its evaluation window's start), linked to the active cause incident
    of its GPU (:func:`cause_among`) or, for a symptom, to the cause finding that answers it
    (:func:`explaining`); a cause that explains an open symptom incident takes it over
    (:func:`promotion`) instead of opening one."""
    active = facts.active
    if event.state == "cleared":
        if not active:
            return []
        return [SeenAt(active[0], event.ts),
                Resolve(active[0], lc.RECOVERED, event.ts,
                        "the rule's condition stopped holding")]
    if active:
        return [FindingAgain(active[0], sev.worst([active[1], event.severity]), event.ts,
                             event.ts + lag_ns)]
    since = event.since or event.ts
    gpu_id = event.gpu_id or None
    wanted = Opened("rule_finding", event.severity, since, _finding_title(event),
                    _finding_summary(event), finding_key(event), gpu_id, event.process,
                    _finding_details(event, since))
    wanted.cause_id = cause_among(facts.causes, since, event.process, settle) \
        if gpu_id is not None else None
    if wanted.cause_id is None and event.rule_kind == SYMPTOM:
        wanted.cause_id = explaining(event, facts.held.get(CAUSE, ()))
    if wanted.cause_id is None and event.rule_kind == CAUSE and event.explains:
        promote = promotion(event, wanted, facts.held.get(SYMPTOM, ()), lag_ns)
        if promote is not None:
            return [promote]
    return [wanted]


# --- cause over symptom: the answer's own relation (gpuwhy/rules/answer.py) ----------------
def explaining(event: RuleFinding, causes: Sequence[tuple]) -> int | None:
    """The incident of the active cause that answers this symptom (the cause
    :func:`answer.answering_cause` ranks first among those explaining it), if any.
    ``causes``: the GPU's active cause-finding incidents (rows of
    :func:`incident_rows.active_findings`), oldest first."""
    held = [(row, _finding_of(row, event.gpu_id)) for row in causes]
    cause = answer.answering_cause(event, [finding for _, finding in held], {})
    return next((row[0] for row, finding in held if finding is cause), None)


def promotion(event: RuleFinding, wanted: Opened, symptoms: Sequence[tuple],
              lag_ns: int) -> Promote | None:
    """A cause that explains an open symptom incident (the oldest of the GPU's active
    symptom-finding incidents, rows of :func:`incident_rows.active_findings`, that
    :func:`answer.explains` says it explains) becomes that incident's answer; the symptom is
    kept as a link of it, and so are further symptoms it explains. None: it explains none."""
    explained = [row for row in symptoms
                 if answer.explains(event, _finding_of(row, event.gpu_id), {})]
    if not explained:
        return None
    incident_id, _, _, _, _, symptom_key, _, symptom_title, severity, _ = explained[0]
    process = event.process
    return Promote(incident_id, symptom_key, {
        "dedup_key": wanted.dedup_key, "title": wanted.title, "summary": wanted.summary,
        "details": wanted.details, "severity": sev.worst([severity, wanted.severity]),
        "process": (process.pid, process.start_time) if process else None,
        "opened_at": wanted.ts, "seen": event.ts, "settle_until": event.ts + lag_ns,
    }, tuple(other[0] for other in explained[1:]), event.ts,
        f"cause established: {event.title} (was the symptom: {symptom_title})"[:lc.NOTE_MAX])


def decide_exited(rows: Sequence[tuple]) -> list[Resolve]:
    """Stalls, and settled Xids that name a process, end when their process does (rows of
    :func:`incident_rows.ended_with_process`: id, exited_at, kind, GPU health); an Xid
    whose GPU still needs a reset is not over with it."""
    return [Resolve(incident_id, lc.PROCESS_EXITED, exited_at,
                    "the process it is about ended")
            for incident_id, exited_at, kind, health in rows
            if not (kind == "xid" and health in UNRESOLVED_HEALTH)]


def decide_settled(causes: Sequence[SettledCause], now: int, dedup_ns: int) -> list[Resolve]:
    """Settled cause incidents on a usable GPU: a health-backed one ends with the transition
    that cleared its GPU (resolved as it happens by the decide stage; one still open, kept
    from before or cleared where no decide saw it, ends now); any other when its GPU reads
    healthy again after it, or ``dedup_ns`` after it was last seen (a lost GPU never times
    out), but not while a process it stalled is still stalled."""
    decided = []
    for cause in causes:
        if cause.health in UNRESOLVED_HEALTH:
            continue
        gpu_id = cause.gpu_id
        if cause.backed and gpu_id:
            cleared = cause.clearing
            how = gh.RESOLUTION[cleared[1]] if cleared else lc.RECOVERED
            decided.append(Resolve(cause.id, how, cleared[0] if cleared else now,
                                   f"GPU {gpu_id} usable again "
                                   f"({cleared[2] if cleared else 'ok'})"[:lc.NOTE_MAX]))
            continue
        if cause.stalls[0]:     # hung since the reset, say: not over
            continue
        last_seen = max(cause.last_seen, cause.stalls[1] or 0)
        back = cause.back
        if back and back[0] <= now:
            how = lc.RECOVERED if cause.kind == "gpu_reset" or back[1] != gh.RESETTING \
                else lc.RESET
            decided.append(Resolve(cause.id, how, max(back[0], last_seen),
                                   f"GPU {gpu_id} healthy again ({back[2]})"[:lc.NOTE_MAX]))
        elif cause.kind != "gpu_lost" and now - last_seen >= dedup_ns:
            decided.append(Resolve(cause.id, lc.TIMEOUT, last_seen + dedup_ns,
                                   f"not seen again for {dedup_ns // NS_PER_SECOND} s; the "
                                   f"GPU stayed usable"))
    return decided


def _finding_details(event: RuleFinding, since: int) -> dict[str, Any]:
    processes = list(event.processes) or ([event.process] if event.process else [])
    return {"rule_id": event.rule_id, "finding_id": event.finding_id, "since": since,
            "window_start": event.window_start, "window_end": event.window_end,
            "evidence": event.evidence, "root_cause": event.root_cause,
            "fixes": list(event.fixes), "verify": event.verify, "group": event.group,
            "rule_kind": event.rule_kind or CAUSE, "explains": list(event.explains),
            "unexplained": list(event.unexplained), "scope": event.scope,
            "processes": [{"pid": p.pid, "start_time": p.start_time} for p in processes],
            **({"instance": event.instance, "mig_profile": event.mig_profile}
               if event.instance else {})}


def _finding_of(row: tuple, gpu_id: str) -> RuleFinding:
    """The finding an active rule-finding incident holds (a row of
    :func:`incident_rows.active_findings`), as the rules sent it: what the answer's relation
    reads (rule, kind, explains, scope, group, process, instance)."""
    incident_id, pid, start_time, rule_id, _, _, details, title, severity, opened_at = row
    try:
        held = json.loads(details or "{}")
    except ValueError:
        held = {}
    held = held if isinstance(held, dict) else {}

    def strings(name: str) -> list[str]:
        value = held.get(name)
        return [str(v) for v in value] if isinstance(value, list) else []
    return RuleFinding(
        ts=opened_at or 0, finding_id=str(held.get("finding_id") or f"incident:{incident_id}"),
        rule_id=str(rule_id or ""), title=title or "", severity=severity or "warning",
        state="firing", gpu_id=gpu_id,
        process=ProcessKey(pid, start_time) if pid is not None and start_time is not None
        else None, group=str(held.get("group") or ""), since=int(held.get("since") or 0),
        rule_kind=str(held.get("rule_kind") or CAUSE), explains=strings("explains"),
        instance=str(held.get("instance") or ""), scope=str(held.get("scope") or ""),
        window_start=int(held.get("window_start") or 0))


def _finding_title(event: RuleFinding) -> str:
    """The rule's title; a MIG instance's finding names the instance (and its profile)."""
    if not event.instance:
        return event.title
    return f"{event.title}: {mig_instance_name(event.instance, event.mig_profile)}"


def _finding_summary(event: RuleFinding) -> str:
    """A cause's summary is its root cause; a symptom's says the cause is not established
    and what each cause that could explain it lacks."""
    where = f"On {mig_instance_name(event.instance, event.mig_profile)} of GPU " \
        f"{event.gpu_id}: " if event.instance else ""
    if event.rule_kind != SYMPTOM:
        return where + event.root_cause
    lacking = "; ".join(event.unexplained[:4])
    return (f"{where}Symptom, cause not established{': ' + lacking if lacking else ''}. "
            f"{event.root_cause}").strip()


def _minor_of(path: str) -> int | None:
    from gpuwhy.identity import classify_device

    kind, minor = classify_device(path)
    return minor if kind == "nvidiaN" else None
