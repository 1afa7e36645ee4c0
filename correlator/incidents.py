"""The decide stage: turn stored events into incidents (deduplicated, open/closed, settling).

Runs inside the batch's transaction, after the writer applied the batch, on the same
connection: incidents and their chains commit with the events they rest on. Kinds:
``xid``, ``gpu_lost`` (fallen off the bus, Xid 79), ``gpu_reset`` (NVRM, the GPU source, or
the driver-call signature of a reset command), ``process_stall``, ``process_exit`` (death
after an Xid or reset) and ``rule_finding``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import Config
from gpuwhy.correlator import bindings, chains, timeline
from gpuwhy.correlator.gpu_health import GpuHealth
from gpuwhy.correlator.pending import Alignment
from gpuwhy.events import Envelope, Event, RuleFinding, methods_by_kind
from gpuwhy.identity import GpuIdentity, ProcessKey
from gpuwhy.reset import NEEDED_STATES, RESET_STATES, reset_kind, state_kind
from gpuwhy.store.queries import resolve_gpu
from gpuwhy.xid import xid_info

log = logging.getLogger(__name__)

CAUSE_KINDS = ("xid", "gpu_lost", "gpu_reset")
SILENT_STATES = NEEDED_STATES + RESET_STATES
EXIT_WINDOW_NS = 60 * NS_PER_SECOND      # a death this soon after an Xid/reset is its effect


def may_open_incident(event: Event) -> bool:
    """An event a detector below may open an incident on (keep in step with them): the
    correlator writes its batch at once instead of on the batch timer, so the alert is not
    held back. Process deaths and stalls follow such an event, or are found on the timer."""
    kind = event.kind
    if kind == "gpu_xid":
        return not event.before_start          # see _detect_gpu_xid
    if kind == "rule_finding":
        return True
    if kind == "gpu_state":
        return event.state == "lost" or state_kind(event.state) == "reset"
    if kind == "kernel_log_record":
        return event.record_kind in ("xid", "fallen_off_bus")
    if kind == "driver_call":
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


class IncidentBuilder:
    """Detectors per event kind, stall checks on the watermark, chain (re)building."""

    def __init__(self, config: Config):
        self.lag_ns = int(config["correlator.lag_seconds"] * NS_PER_SECOND)
        self.stall_ns = int(config["correlator.stall_seconds"] * NS_PER_SECOND)
        self.stall_util = float(config["correlator.stall_util_pct"])
        self.dedup_ns = int(config["correlator.dedup_seconds"] * NS_PER_SECOND)
        self.alignment = Alignment(config["correlator.lag_seconds"],
                                   config["correlator.pending_max"])
        self.timelines = timeline.TimelineBuilder()
        self.proc_root: str = config["probes.proc_root"]
        self._proc_read = False
        self.opened = 0
        self.merged = 0
        self._next_stall_check = 0
        self._detectors = methods_by_kind(self, "_detect_")
        self.health = GpuHealth()     # the GPU health state machine, fed every event below

    # --- the stage -------------------------------------------------------------------------
    def decide(self, db: Database, envelopes: list[Envelope],
               wall_ns: int | None = None) -> list[int]:
        """Detect, deduplicate, rebuild settling chains; returns the ids of new incidents.
        ``wall_ns``: the wall clock when running live (None: event time only, for replays)."""
        now = self.alignment.observe(envelopes, wall_ns)
        if not self._proc_read:         # the driver's own minor/UUID/PCI table, once
            for identity in bindings.proc_identities(self.proc_root):
                bindings.learn(db, identity, now)
            self._proc_read = True
        new: list[int] = []
        self.timelines.discard_pending()    # held by a decide that failed: rolled back with it
        for envelope in envelopes:
            event = envelope.event
            self.timelines.apply(db, event)
            self.health.observe(db, event)
            detector = self._detectors.get(event.kind)
            if detector is None:
                continue
            for wanted in detector(db, event) or ():
                incident_id, created = self._open(db, wanted)
                if created:
                    new.append(incident_id)
        self.timelines.write_pending(db)    # before the stall checks and chains read the store
        if now >= self._next_stall_check:
            for wanted in self._stalls(db, now):
                incident_id, created = self._open(db, wanted)
                if created:
                    new.append(incident_id)
            self._next_stall_check = now + NS_PER_SECOND // 2
        for incident_id in self.alignment.settling(db):
            chains.rebuild(db, incident_id, self)
        # Stalls close when the GPU is busy again or the process ends, rule findings when the
        # rules engine clears them; the rest once settled.
        db.execute("update incidents set state = 'closed', closed_at = last_seen where "
                   "state = 'open' and kind not in ('process_stall', 'rule_finding') and "
                   "settle_until < ?", [now])
        db.execute("update incidents set state = 'closed', closed_at = p.exited_at from "
                   "processes p where incidents.state = 'open' and incidents.kind = "
                   "'process_stall' and p.pid = incidents.pid and "
                   "p.start_time = incidents.start_time and p.exited_at is not null")
        return new

    def counters(self) -> dict[str, int]:
        return {"incidents_opened": self.opened, "incidents_merged": self.merged,
                **self.alignment.counters()}

    def settle_ns(self, kind: str) -> int:
        """How long an incident of ``kind`` takes in late events and effects after its last."""
        effects = self.stall_ns + 3 * NS_PER_SECOND if kind in CAUSE_KINDS else 0
        return self.lag_ns + effects

    def _open(self, db: Database, wanted: Opened) -> tuple[int, bool]:
        row = db.execute("select id, count, severity from incidents where dedup_key = ? and "
                         "last_seen >= ? and last_seen <= ? order by id desc limit 1",
                         [wanted.dedup_key, wanted.ts - self.dedup_ns,
                          wanted.ts + self.dedup_ns]).fetchone()
        settle = wanted.ts + self.settle_ns(wanted.kind)
        if row:
            incident_id, count, severity = row
            worse = sev.worst([severity, wanted.severity])   # a legacy name is mapped
            # A repeat reopens a closed incident: it is the same cause again, and a stall
            # merged into while left closed was found again (and merged) at every check.
            db.execute("update incidents set count = ?, severity = ?, "
                       "last_seen = max(last_seen, ?), opened_at = min(opened_at, ?), "
                       "settle_until = max(coalesce(settle_until, 0), ?), updated_at = ?, "
                       "state = 'open', closed_at = null where id = ?",
                       [count + 1, worse, wanted.ts, wanted.ts, settle, wanted.ts, incident_id])
            self.merged += 1
            return incident_id, False
        process = wanted.process
        incident_id = db["incidents"].insert({
            "opened_at": wanted.ts, "closed_at": None, "kind": wanted.kind,
            "severity": sev.worst([wanted.severity]), "gpu_id": wanted.gpu_id,
            "pid": process.pid if process else None,
            "start_time": process.start_time if process else None,
            "title": wanted.title, "summary": wanted.summary, "chain": "[]",
            "dedup_key": wanted.dedup_key, "count": 1, "last_seen": wanted.ts,
            "state": "open", "settle_until": settle, "updated_at": wanted.ts,
            "confidence": None, "details": json.dumps(wanted.details, sort_keys=True),
        }).last_pk
        self.opened += 1
        chains.rebuild(db, incident_id, self)
        return incident_id, True

    # --- detectors -------------------------------------------------------------------------
    def _xid(self, db: Database, ts: int, gpu_id: str | None, code: int, pid: int | None,
             name: str | None, origin: str, detail: str) -> list[Opened]:
        info = xid_info(code)
        kind = "gpu_lost" if code == 79 else "xid"
        process = bindings.process_with_pid_at(db, pid, ts) if pid else None
        details = {"xid": code, "origin": origin, "pid": pid, "name": name, "detail": detail,
                   **info.as_fields()}
        return [Opened(kind, info.severity, ts, f"Xid {code}: {info.title}",
                       f"GPU {gpu_id or '?'}: {info.action}", f"{kind}:{gpu_id}:{code}",
                       gpu_id, process, details)]

    def _detect_kernel_log_record(self, db: Database, event: Event) -> list[Opened]:
        gpu_id = resolve_gpu(db, uuid=event.uuid, pci=event.pci)
        if event.record_kind == "xid" and event.xid is not None:
            return self._xid(db, event.ts, gpu_id, event.xid, event.pid, event.name,
                             f"kernel log ({event.origin})", event.message)
        if event.record_kind == "fallen_off_bus":
            return self._xid(db, event.ts, gpu_id, 79, None, None,
                             f"kernel log ({event.origin})", event.message)
        if event.record_kind == "gpu_uuid" and event.pci and event.uuid:
            bindings.learn(db, GpuIdentity(uuid=event.uuid, pci_bus_id=event.pci), event.ts)
        return []

    def _detect_gpu_seen(self, db: Database, event: Event) -> list[Opened]:
        bindings.learn(db, GpuIdentity(uuid=event.uuid, pci_bus_id=event.pci_bus_id,
                                       index=event.index, minor=event.minor), event.ts)
        return []

    def _detect_gpu_xid(self, db: Database, event: Event) -> list[Opened]:
        if event.before_start:
            # An Xid from before gpuwhy started, time unknown (dcgm-exporter's gauge at the
            # first scrape): an incident would be dated now and alert as if it just happened.
            # It stays a stored event and a note on the GPU page; GPU health may use it.
            return []
        return self._xid(db, event.ts, event.gpu_id, event.xid, None, None,
                         f"GPU source {event.source}", event.detail)

    def _detect_gpu_state(self, db: Database, event: Event) -> list[Opened]:
        if event.state == "lost":
            return self._xid(db, event.ts, event.gpu_id, 79, None, None,
                             f"GPU source {event.source}", event.detail)
        if state_kind(event.state) == "reset":   # needed: the Xid behind it is the incident
            return [self._reset(event.gpu_id, event.ts, f"GPU source {event.source}: "
                                f"{event.state}", {"detail": event.detail})]
        return []

    def _reset(self, gpu_id: str | None, ts: int, how: str, details: dict) -> Opened:
        # Wide dedup: the driver calls, the GPU source and NVRM all report the one reset.
        return Opened("gpu_reset", "critical", ts, "GPU reset",
                      f"GPU {gpu_id or '?'} was reset ({how}); its processes lost their "
                      f"contexts", f"gpu_reset:{gpu_id}", gpu_id, None,
                      {"seen_by": how, **details})

    def _detect_driver_call(self, db: Database, event: Event) -> list[Opened]:
        if reset_kind(event.sub_name) != "reset":   # a request: the reset call follows
            return []
        key = event.process
        minor = _minor_of(event.path)
        gpus = [resolve_gpu(db, minor=minor)] if minor is not None else \
            bindings.gpus_of(db, key, event.ts)
        return [self._reset(gpu, event.ts, f"{event.sub_name} by pid {key.pid}",
                            {"pid": key.pid, "start_time": key.start_time,
                             "path": event.path}) for gpu in gpus or [None]]

    def _detect_process_exited(self, db: Database, event: Event) -> list[Opened]:
        key = event.process
        if event.exit_code == 0 and not event.signal:
            return []                       # a clean exit is not a death
        found = []
        for gpu_id in set(bindings.gpus_of(db, key, event.ts - 1)):
            cause = db.execute(
                "select id, kind, title, details from incidents where gpu_id = ? and kind in "
                "('xid', 'gpu_lost', 'gpu_reset') and opened_at between ? and ? "
                "order by opened_at desc limit 1",
                [gpu_id, event.ts - EXIT_WINDOW_NS, event.ts]).fetchone()
            if cause is None:
                continue
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
                                 "signal": event.signal}))
        return found

    def _detect_rule_finding(self, db: Database, event: RuleFinding) -> list[Opened]:
        """A firing finding opens (or, on a severity change, updates) its incident; a cleared
        one closes it. Shadow findings are the rules' own business: no incident, no alert."""
        if event.shadow:
            return []
        dedup_key = f"rule_finding:{event.finding_id}"
        if event.state == "cleared":
            db.execute("update incidents set state = 'closed', closed_at = ?, last_seen = ? "
                       "where dedup_key = ? and state = 'open'",
                       [event.ts, event.ts, dedup_key])
            return []
        # An incident keeps the worst severity its finding reached, as a merged repeat does
        # in _open: a finding that calms down is still the incident it escalated to.
        open_row = db.execute("select id, severity from incidents where dedup_key = ? and "
                              "state = 'open'", [dedup_key]).fetchone()
        if open_row:
            db.execute("update incidents set severity = ?, last_seen = max(last_seen, ?), "
                       "settle_until = ? where id = ?",
                       [sev.worst([open_row[1], event.severity]), event.ts,
                        event.ts + self.lag_ns, open_row[0]])
            return []
        process = event.process
        details = {"rule_id": event.rule_id, "finding_id": event.finding_id,
                   "window_start": event.window_start, "window_end": event.window_end,
                   "evidence": event.evidence, "root_cause": event.root_cause,
                   "fixes": list(event.fixes), "verify": event.verify, "group": event.group}
        return [Opened("rule_finding", event.severity, event.window_start or event.ts,
                       event.title, event.root_cause, dedup_key, event.gpu_id or None,
                       process, details)]

    # --- stalls ----------------------------------------------------------------------------
    def _stalls(self, db: Database, now: int) -> list[Opened]:
        """Bound, living processes whose GPU has been near idle (or silent while resetting or
        lost) for ``stall_seconds`` after being busy."""
        found = []
        rows = db.execute(
            "select b.pid, b.start_time, b.gpu_id, min(b.since) from gpu_bindings b "
            "join processes p on p.pid = b.pid and p.start_time = b.start_time "
            "where b.until is null and p.exited_at is null "
            "group by b.pid, b.start_time, b.gpu_id").fetchall()
        for pid, start_time, gpu_id, since in rows:
            key = ProcessKey(pid, start_time)
            dedup_key = f"process_stall:{key}:{gpu_id}"
            idle_since = self._idle_since(db, gpu_id, since, now)
            if idle_since is None or now - idle_since < self.stall_ns:
                if idle_since is None:      # busy again: the stall is over
                    db.execute("update incidents set state = 'closed', closed_at = ? where "
                               "dedup_key = ? and state = 'open'", [now, dedup_key])
                continue
            ongoing = db.execute("update incidents set last_seen = max(last_seen, ?) where "
                                 "dedup_key = ? and state = 'open' and opened_at <= ?",
                                 [now, dedup_key, now]).rowcount
            if ongoing:
                continue
            how = timeline.classify_stall(db, key, idle_since, now)
            found.append(Opened(
                "process_stall", "warning", idle_since,
                f"Process {pid} stalled: GPU idle", f"pid {pid} alive but GPU {gpu_id} near "
                f"idle for {(now - idle_since) / NS_PER_SECOND:.0f}s; process {how}",
                dedup_key, gpu_id, key, {"classified": how}))
        return found

    def _idle_since(self, db: Database, gpu_id: str, bound_since: int, now: int) -> int | None:
        """Start of the idle stretch that reaches ``now``, if the GPU was busy before it and
        after the process bound it (a process that never saw it busy did not stall). A GPU
        that went silent (lost, resetting) after its last busy sample was idle from then,
        even if it has come back since."""
        busy = db.execute("select max(ts) from gpu_samples where gpu_id = ? and gpu_util > ? "
                          "and ts between ? and ?",
                          [gpu_id, self.stall_util, bound_since, now]).fetchone()[0]
        if busy is None:
            return None
        after = db.execute("select min(ts) from gpu_samples where gpu_id = ? and ts > ?",
                           [gpu_id, busy]).fetchone()[0]
        state = db.execute("select state, state_since from gpus where id = ?",
                           [gpu_id]).fetchone()
        went_silent = None
        if state and state[1] and state[1] > busy:      # its state changed since: how?
            went_silent = db.execute(
                "select min(ts) from events where ts > ? and ts <= ? and kind = 'gpu_state' "
                "and gpu_id = ? and json_extract(body, '$.state') in (?, ?, ?)",
                [busy, now, gpu_id, *SILENT_STATES]).fetchone()[0]
            if went_silent is None and state[0] in SILENT_STATES:
                went_silent = state[1]
        starts = [t for t in (after, went_silent) if t is not None]
        return min(starts) if starts else None


def _minor_of(path: str) -> int | None:
    from gpuwhy.identity import classify_device

    kind, minor = classify_device(path)
    return minor if kind == "nvidiaN" else None
