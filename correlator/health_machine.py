"""The GPU health state machine: every source's events move a GPU between the states of
:mod:`gpuwhy.gpu_health`, each transition stored with its evidence and what clears it.

Runs in the decide stage (``IncidentBuilder.decide`` calls :meth:`GpuHealth.observe` for
every event), inside the batch's transaction: a transition commits with the events it rests
on. Sources and what they mean:

- kernel log: an Xid (its catalogue entry, :func:`gpuwhy.xid.catalogue_fields`), fallen off
  the bus, RmInitAdapter failed; every kernel-log and cron event carries the boot id, and a
  new one is a reboot, which clears every state entered in an older boot;
- the host: its boot id (``/proc/sys/kernel/random/boot_id``), read once at start, is the
  boot every other event happens in, so a reboot is seen without a kernel-log source: at the
  first event after start, every state entered in another boot is cleared by that reboot;
- GPU source: its Xids, its ``gpu_state`` (lost, reset_required, resetting, back) and its
  samples (throttling, SBE storm, pending row remap, uncorrectable ECC, remap failure, a
  failed or unhealthy NVLink fabric);
- driver calls: a reset call that returned NV_OK (:mod:`gpuwhy.reset`).

What clears a state is what it waits for (:func:`gpuwhy.gpu_health.remedies`, kept with the
state): the catalogue's reset or reboot for an Xid's state, never a counter source answering
for the GPU again. A sample with clean counters (or the source's ``back``) is the GPU read
again, and clears only what reading clears: the end of a reset (``resetting``) and a "lost"
that only the GPU source said, with no kernel Xid (its own transient trouble). A source that
still reads a GPU the kernel says fell off the bus contradicts it: that is kept as evidence
(:attr:`GpuHealth.contradicted`, once per state), not taken as recovery.

Every move is a :class:`gpuwhy.gpu_health.Transition` value, applied by the store
(:func:`gpuwhy.store.health.apply_transition`) and kept in :attr:`GpuHealth.transitions` for
the incidents that rest on the GPU's health (``IncidentBuilder`` resolves them by it).

The current state lives on the GPU's ``gpus`` row and is read from there for each event
(never cached), so a decide that fails and rolls back leaves nothing stale behind.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from gpuwhy import gpu_health as gh
from gpuwhy.events import (
    CronExecution,
    DriverCall,
    Event,
    GpuSample,
    GpuState,
    GpuXid,
    KernelLogCheckpoint,
    KernelLogRecord,
    methods_by_kind,
)
from gpuwhy.gpufields import FABRIC_HEALTH, FABRIC_STATES
from gpuwhy.identity import classify_device
from gpuwhy.reset import reset_kind, state_kind
from gpuwhy.store import gpu_bindings, queries
from gpuwhy.store import health as store_health
from gpuwhy.xid import catalogue_fields, xid_info

MAX_DETAIL = 300     # evidence quotes a line or a source's detail; they are untrusted
BOOT_ID_FILE = ("sys", "kernel", "random", "boot_id")     # under the proc root


def host_boot_id(proc_root: str = "/proc") -> str | None:
    """The host's current boot id as the kernel-log source spells it (no dashes, as
    journald's ``_BOOT_ID``), None when it cannot be read."""
    try:
        found = Path(proc_root, *BOOT_ID_FILE).read_text().strip().replace("-", "")
    except (OSError, UnicodeDecodeError):
        return None
    return found or None


class GpuHealth:
    """Decides each GPU's health from the events of a batch (see the module docstring)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._boot: str | None = None           # the last boot id an event carried
        self._stored_boot: str | None = None
        # The host's boot, read once here: the boot a live event happens in. Older boots'
        # states are cleared at the first event (the constructor has no store).
        self._host_boot = host_boot_id(proc_root)
        self._host_boot_checked = self._host_boot is None
        self._event_boot: str | None = None     # the boot id of the event being applied
        # Per GPU: recent (ts, corrected ECC count) for the SBE-storm window and the last
        # uncorrectable remapped-rows count (an increase is a row waiting for a reset).
        self._sbe: dict[str, deque[tuple[int, float]]] = {}
        self._remapped: dict[str, float] = {}
        # Each GPU's health as read or moved in the running decide: a sample with nothing
        # wrong asks only this (a SELECT per sample was a tenth of the decide stage).
        # ``forget()`` at each decide, and after anything else that may rewrite GPU rows.
        self._states: dict[str, str | None] = {}
        self._handlers = methods_by_kind(self, "_on_")
        # What moved since the caller last took them (:meth:`take`): the transitions, and
        # the GPUs whose state a source contradicted (first time in that state).
        self.transitions: list[gh.Transition] = []
        self.contradicted: list[tuple[str, dict[str, Any]]] = []

    def take(self) -> tuple[list[gh.Transition], list[tuple[str, dict[str, Any]]]]:
        """The transitions and contradictions decided since the last take, oldest first."""
        moved, self.transitions = self.transitions, []
        seen, self.contradicted = self.contradicted, []
        return moved, seen

    def forget(self) -> None:
        """Read GPUs' health from the store again (a new decide; GPU rows merged)."""
        self._states.clear()

    def _state(self, db: Database, gpu_id: str) -> str | None:
        try:
            return self._states[gpu_id]
        except KeyError:
            state = self._states[gpu_id] = queries.gpu_health_state(db, gpu_id)
            return state

    def handles(self, kind: str) -> bool:
        """Whether an event of ``kind`` may move a GPU's health (others need no ``observe``)."""
        return kind in self._handlers

    def first_seen(self, db: Database, ts: int) -> None:
        """An event at ``ts`` is about to be observed: the host's boot is checked at the first."""
        if not self._host_boot_checked:
            self._host_boot_checked = True
            self._host_boot_seen(db, ts)

    def observe(self, db: Database, event: Event) -> None:
        """Apply one event (already written by the store's writer) to its GPU's health."""
        self.first_seen(db, event.ts)
        handler = self._handlers.get(event.kind)
        if handler is not None:
            self._event_boot = getattr(event, "boot_id", None) or None
            try:
                handler(db, event)
            finally:
                self._event_boot = None

    # --- the machine -----------------------------------------------------------------------
    def _boot_id(self, db: Database) -> str | None:
        """The boot a new state is entered in: the event's own (a kernel-log or cron event
        says which boot it was logged in), else the host's (read at start), else the last one
        an event carried, else the kernel-log source's stored one (read once; None where
        none is known)."""
        found = self._event_boot or self._host_boot or self._boot
        if found:
            return found
        if self._stored_boot is None:
            self._stored_boot = queries.last_boot_id(db) or ""
        return self._stored_boot or None

    def _move(self, db: Database, gpu_id: str, ts: int, state: str, cause: str,
              evidence: dict[str, Any], causes: list[str] | None = None,
              pci: str | None = None, how: str | None = None,
              remedies: frozenset[str] | None = None) -> None:
        """Decide a transition (or, within degraded, a changed set of causes) and have the
        store apply it. ``how``: the remedy that cleared the state it leaves (the new state
        then waits for its own remedies only); ``remedies``: what the new state waits for,
        where the caller worked it out (a state kept, waiting for less)."""
        current = queries.gpu_health(db, gpu_id)
        previous = (current["health"] if current else None) or gh.OK
        if remedies is None:
            remedies = gh.remedies(state, cause) if how else gh.entry_remedies(
                gh.remedies(state, cause), previous,
                gh.stored_remedies(previous, current["evidence"] if current else {}))
        move = gh.Transition(
            gpu_id, ts, state, previous, cause,
            {**evidence, **({"causes": causes} if causes is not None else {})},
            remedies, how, self._boot_id(db), pci)
        store_health.apply_transition(db, move)
        self.transitions.append(move)
        self._states[gpu_id] = state
        if state in (gh.OK, gh.RESETTING):
            # a reset or reboot clears the volatile counters the sample windows were built on
            self._sbe.pop(gpu_id, None)
            self._remapped.pop(gpu_id, None)

    def _escalate(self, db: Database, gpu_id: str | None, ts: int, state: str, cause: str,
                  evidence: dict[str, Any], pci: str | None = None,
                  own: frozenset[str] = frozenset()) -> None:
        """Move to ``state`` if it is worse than the current one; within degraded, add the
        cause (each degraded cause clears its own way). ``own``: what the fact asks for
        where its catalogue fields said (an Xid), else the state's rule for its cause."""
        if not gpu_id:
            return
        current = queries.gpu_health(db, gpu_id)
        now = (current["health"] if current else None) or gh.OK
        if state == gh.DEGRADED and now == gh.DEGRADED and current is not None:
            causes = list(current["evidence"].get("causes", []))
            if cause not in causes:
                self._move(db, gpu_id, ts, gh.DEGRADED, cause, evidence, [*causes, cause])
            return
        own = own or gh.remedies(state, cause)
        waits = gh.stored_remedies(now, current["evidence"] if current else {})
        if gh.RANK[state] > gh.RANK[now]:
            self._move(db, gpu_id, ts, state, cause, evidence,
                       [cause] if state == gh.DEGRADED else None, pci,
                       remedies=gh.entry_remedies(own, now, waits))
            return
        if state in gh.UNUSABLE and now in (gh.LOST, gh.RESET_REQUIRED, gh.REBOOT_REQUIRED):
            # A fact no worse that waits for less (a kernel Xid 79 on a GPU the source lost,
            # a reboot-class Xid on a lost one): the state stays and waits for what clears
            # both, so that reading the GPU again cannot clear what the catalogue says needs
            # a reboot.
            narrower = own & waits
            if narrower and narrower < waits:
                self._move(db, gpu_id, ts, now, cause, {**evidence, "kept": now}, pci=pci,
                           remedies=narrower)

    def _reset_seen(self, db: Database, gpu_id: str, ts: int, evidence: dict[str, Any],
                    done: bool = False) -> None:
        """A reset (gpuwhy/reset.py): resetting until the GPU source reads the GPU again;
        ``done`` (a reset call returned NV_OK on a GPU no source reads) goes on to ok. A
        state that waits for a reboot (the catalogue says so: Xid 79, a reboot-class Xid)
        is not cleared by a reset: it stays as it is."""
        current = queries.gpu_health(db, gpu_id)
        now = (current["health"] if current else None) or gh.OK
        waits = gh.stored_remedies(now, current["evidence"] if current else {})
        if now not in (gh.OK, gh.RESETTING) and not gh.clears_by(gh.BY_RESET, now, waits):
            return              # a GPU reset does not clear what only a reboot clears
        self._move(db, gpu_id, ts, gh.RESETTING, "reset", evidence,
                   how=gh.BY_RESET if now != gh.OK else None)
        if done and not (current and current["source"]):
            self._move(db, gpu_id, ts, gh.OK, "reset done", {
                **evidence, "why": "the reset call returned NV_OK and no GPU source reads "
                                   "this GPU to say otherwise"}, how=gh.BY_RESET)

    def _boot_seen(self, db: Database, boot_id: str, ts: int) -> None:
        """A new boot id is a reboot: it clears every state entered in an older boot."""
        # Compared with each GPU's own boot, not only the last one seen: after a reboot the
        # first batch already carries the new cursor, so the store's "last boot" is new too.
        if not boot_id or boot_id == self._boot:
            return
        before, self._boot = self._boot, boot_id
        for gpu_id, _state, since, entered_in in queries.gpus_not_ok(db):
            if entered_in and entered_in != boot_id and (since or 0) <= ts:
                self._move(db, gpu_id, ts, gh.OK, "reboot",
                           {"event": "boot id changed", "boot_id_before": entered_in,
                            "boot_id_now": boot_id, "last_boot_seen": before},
                           how=gh.BY_REBOOT)

    def _host_boot_seen(self, db: Database, ts: int) -> None:
        """At the first event after start: the host booted since every state entered in
        another boot (whether or not a kernel-log source saw it), so that reboot clears
        them, dated at this event (when the reboot happened is not known), never before the
        state it clears."""
        for gpu_id, _state, since, entered_in in queries.gpus_not_ok(db):
            if entered_in and entered_in != self._host_boot:
                self._move(db, gpu_id, max(ts, since or 0), gh.OK, "reboot",
                           {"event": "host boot id at start", "boot_id_before": entered_in,
                            "boot_id_now": self._host_boot}, how=gh.BY_REBOOT)

    def _xid(self, db: Database, gpu_id: str | None, ts: int, code: int,
             catalogue: dict[str, Any], evidence: dict[str, Any],
             pci: str | None = None) -> None:
        target = gh.xid_target(code, catalogue)
        if target is None:
            return              # its action needs no reset or reboot: health unchanged
        state, cause = target
        self._escalate(db, gpu_id, ts, state, cause,
                       {**evidence, "xid": code, "title": catalogue.get("title", "")}, pci,
                       own=gh.xid_remedies(catalogue) if state != gh.DEGRADED else frozenset())

    # --- the sources -----------------------------------------------------------------------
    def _on_kernel_log_record(self, db: Database, event: KernelLogRecord) -> None:
        self._boot_seen(db, event.boot_id, event.ts)
        kind = event.record_kind
        if kind not in ("xid", "fallen_off_bus", "rm_init_failed"):
            return
        gpu_id = queries.resolve_gpu(db, uuid=event.uuid, pci=event.pci)
        evidence = {"event": f"kernel log {kind}", "origin": event.origin,
                    "cursor": event.cursor,
                    "line": (event.line or event.message or "")[:MAX_DETAIL]}
        if kind == "rm_init_failed":
            self._escalate(db, gpu_id, event.ts, gh.RESET_REQUIRED, "rm_init_failed",
                           evidence, event.pci)
            return
        code = event.xid if kind == "xid" and event.xid is not None else 79
        if kind == "xid" and event.xid is None:
            return
        self._xid(db, gpu_id, event.ts, code, catalogue_fields(kind, code, event.details),
                  evidence, event.pci)

    def _on_kernel_log_checkpoint(self, db: Database, event: KernelLogCheckpoint) -> None:
        self._boot_seen(db, event.boot_id, event.ts)

    def _on_cron_execution(self, db: Database, event: CronExecution) -> None:
        self._boot_seen(db, event.boot_id, event.ts)

    def _on_gpu_xid(self, db: Database, event: GpuXid) -> None:
        if event.before_start:
            return              # from before gpuwhy started: when, and whether a reset has
            # cleared it since, nobody can tell (the GPU page shows it as a note)
        self._xid(db, event.gpu_id, event.ts, event.xid, xid_info(event.xid).as_fields(),
                  {"event": "gpu_xid", "source": event.source,
                   "detail": event.detail[:MAX_DETAIL]})

    def _on_gpu_state(self, db: Database, event: GpuState) -> None:
        evidence = {"event": f"gpu_state {event.state}", "source": event.source,
                    "detail": event.detail[:MAX_DETAIL]}
        if event.state == gh.LOST:
            self._escalate(db, event.gpu_id, event.ts, gh.LOST, gh.SOURCE_LOST, evidence)
        elif event.state == gh.RESET_REQUIRED:
            self._escalate(db, event.gpu_id, event.ts, gh.RESET_REQUIRED,
                           "source says reset required", evidence)
        elif state_kind(event.state) == "reset":
            self._reset_seen(db, event.gpu_id, event.ts, evidence)
        elif state_kind(event.state) == "back":
            current = queries.gpu_health(db, event.gpu_id)
            if current and current["health"] in (gh.LOST, gh.RESETTING) and \
                    event.ts >= (current["since"] or 0):
                self._read_again(db, event.gpu_id, event.ts, current, "source reads it again",
                                 evidence)

    def _read_again(self, db: Database, gpu_id: str, ts: int, current: dict[str, Any],
                    cause: str, evidence: dict[str, Any]) -> None:
        """The GPU source read a lost or resetting GPU again: ok where reading is what the
        state waits for (the end of a reset, how: ``reset``; a loss only the source said,
        how: ``read``); else, on a GPU the kernel says fell off the bus, contradicting
        evidence, kept once, never a recovery."""
        now = current["health"]
        waits = gh.stored_remedies(now, current["evidence"])
        if now == gh.RESETTING:
            # the reset it waited for has ended: the source reads the GPU clean after it
            self._move(db, gpu_id, ts, gh.OK, cause, evidence, how=gh.BY_RESET)
        elif gh.clears_by(gh.BY_READ, now, waits):
            self._move(db, gpu_id, ts, gh.OK, cause, evidence, how=gh.BY_READ)
        elif now == gh.LOST and "contradicted" not in current["evidence"]:
            seen = {**evidence, "ts": ts, "state": now,
                    "state_cause": current["evidence"].get("cause"),
                    "clears_by": sorted(waits)}
            store_health.note_contradiction(db, gpu_id, seen)
            self.contradicted.append((gpu_id, seen))

    def _on_driver_call(self, db: Database, event: DriverCall) -> None:
        if reset_kind(event.sub_name) != "reset" or event.ret != 0 or event.status != 0:
            return              # a request, or a reset call that failed: no reset happened
        kind, minor = classify_device(event.path)
        gpus = [queries.resolve_gpu(db, minor=minor)] if kind == "nvidiaN" and \
            minor is not None else gpu_bindings.gpus_of(db, event.process, event.ts)
        evidence = {"event": f"driver call {event.sub_name}", "pid": event.process.pid,
                    "start_time": event.process.start_time, "path": event.path}
        for gpu_id in gpus:
            if gpu_id:
                self._reset_seen(db, gpu_id, event.ts, evidence, done=True)

    def _on_gpu_sample(self, db: Database, event: GpuSample) -> None:
        if event.instance:
            return              # a MIG instance: the whole GPU's sample speaks for it
        gpu_id, ts, fields = event.gpu_id, event.ts, event.fields
        bad = gh.uncorrectable(fields)
        throttled = gh.throttling(fields)
        sbe, remapped = fields.get("ecc_sbe_volatile"), fields.get("row_remap_uncorrectable")
        storm = sbe is not None and self._sbe_storm(gpu_id, ts, sbe)
        # The source's own flag where it has one; else a rise of the uncorrectable count.
        flagged = gh.remap_pending(fields)
        pending = (remapped is not None and self._remap_pending(gpu_id, remapped)) or flagged
        if not (bad or throttled or storm or pending or gh.fabric_fault(fields)) and \
                self._state(db, gpu_id) in (None, gh.OK):
            return              # the common case, once a second per GPU: kept cheap
        said = gh.sample_causes(fields)
        fabric = [c for c in (gh.FABRIC_FAILED, gh.FABRIC_UNWELL) if said.get(c)]
        evidence = {"event": "gpu_sample", "source": event.source}
        current = queries.gpu_health(db, gpu_id)
        now = (current["health"] if current else None) or gh.OK
        later = current is not None and ts > (current["since"] or 0)
        if current is None:
            pass                # a GPU with no health row yet: only an escalation below
        elif later and fields and bad is None and now in (gh.LOST, gh.RESETTING):
            self._read_again(db, gpu_id, ts, current,
                             "source reads it again with clean counters", evidence)
        elif later and now == gh.DEGRADED:
            # each cause a sample clears ends when a sample says it no longer holds
            causes = list(current["evidence"].get("causes", []))
            ended = [c for c in causes if c in gh.SAMPLE_CLEARED_CAUSES and said.get(c) is False]
            if ended:
                kept = [c for c in causes if c not in ended]
                why = "; ".join(gh.ENDED[c] for c in ended)
                if kept:
                    self._move(db, gpu_id, ts, gh.DEGRADED, why, evidence, kept)
                else:
                    self._move(db, gpu_id, ts, gh.OK, why, evidence)
        if bad is not None:
            self._escalate(db, gpu_id, ts, gh.RESET_REQUIRED, bad, {
                **evidence, "ecc_dbe_volatile": fields.get("ecc_dbe_volatile"),
                "row_remap_failed": fields.get("row_remap_failed")})
        if throttled:
            self._escalate(db, gpu_id, ts, gh.DEGRADED, gh.THROTTLING,
                           {**evidence, "clocks_event_reasons": hex(throttled)})
        if storm:
            self._escalate(db, gpu_id, ts, gh.DEGRADED, gh.SBE_STORM,
                           {**evidence, "ecc_sbe_volatile": fields.get("ecc_sbe_volatile"),
                            "window_s": gh.SBE_STORM_WINDOW_NS // 10**9})
        if pending:
            self._escalate(db, gpu_id, ts, gh.DEGRADED, gh.ROW_REMAP_PENDING,
                           {**evidence, "row_remap_uncorrectable": remapped,
                            **({"row_remap_pending": 1} if flagged else {})})
        for cause in fabric:
            self._escalate(db, gpu_id, ts, gh.DEGRADED, cause,
                           {**evidence, **_fabric_named(fields)})

    def _remap_pending(self, gpu_id: str, remapped: float | None) -> bool:
        """Whether the uncorrectable remapped-rows count went up: a row waits for a reset."""
        if remapped is None:
            return False
        before = self._remapped.get(gpu_id)
        self._remapped[gpu_id] = remapped
        return before is not None and remapped > before

    def _sbe_storm(self, gpu_id: str, ts: int, count: float | None) -> bool:
        if count is None:
            return False
        window = self._sbe.setdefault(gpu_id, deque())
        if window and count < window[-1][1]:
            window.clear()      # the volatile counter went back: the GPU was reset
        window.append((ts, count))
        while window and window[0][0] < ts - gh.SBE_STORM_WINDOW_NS:
            window.popleft()
        return window[-1][1] - window[0][1] >= gh.SBE_STORM_COUNT


def _fabric_named(fields: dict[str, float]) -> dict[str, str]:
    """The NVLink fabric's state and health a sample read, by name ("Failure", "Unhealthy")."""
    named = {}
    for name, table in (("fabric_state", FABRIC_STATES), ("fabric_health", FABRIC_HEALTH)):
        if fields.get(name) is not None:
            named[name] = table.get(int(fields[name]), str(fields[name]))
    return named
