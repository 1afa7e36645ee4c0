"""GPU health decisions as values: from an event and the store's facts, the moves to make.

The rules of :mod:`gpuwhy.correlator.health_machine` (what each source's events mean, what
clears a state), with no database at hand: :class:`HealthDecider` takes an event and the
facts the store read for it (:class:`gpuwhy.store.health.HealthFacts`: the current health
of the GPUs the event may move, the GPUs it names, every GPU not ok where a new boot id came)
and returns the steps, in order: :class:`gpuwhy.gpu_health.Transition` and
:class:`gpuwhy.gpu_health.Contradiction` values that the store applies
(:func:`gpuwhy.store.health.apply_health`). One event may move a GPU twice (a reset call that
returned NV_OK: resetting, then ok) or several GPUs (a reboot): each step is decided from the
GPU's health as the steps before it leave it, as the store would read it back.

The decider keeps what no store row holds: the last boot id an event carried, and each GPU's
recent corrected-ECC counts (the SBE-storm window) and uncorrectable remapped-rows count (an
increase is a row waiting for a reset), which a move to ok or resetting forgets.

A transition's ``boot_id`` is the event's own boot, else the host's, else the last one an
event carried; None where none is known (the caller then fills in the kernel-log source's
stored one: a read this module does not do).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

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
)
from gpuwhy.gpufields import FABRIC_HEALTH, FABRIC_STATES
from gpuwhy.identity import classify_device
from gpuwhy.reset import reset_kind, state_kind
from gpuwhy.store.health import GpuHealthNow, HealthFacts
from gpuwhy.xid import catalogue_fields, xid_info

MAX_DETAIL = 300     # evidence quotes a line or a source's detail; they are untrusted
GPU_RECORDS = ("xid", "fallen_off_bus", "rm_init_failed")    # kernel-log records about health

Step = gh.Transition | gh.Contradiction

# The event kinds that may move a GPU's health: those :meth:`HealthDecider.decide` takes, and
# the GPU source's samples (:meth:`HealthDecider.sample`).
KINDS = frozenset({KernelLogRecord.kind, KernelLogCheckpoint.kind, CronExecution.kind,
                   GpuXid.kind, GpuState.kind, DriverCall.kind, GpuSample.kind})


def names_gpu(event: KernelLogRecord) -> bool:
    """Whether a kernel-log record may move its GPU's health (an Xid with its code, fallen
    off the bus, RmInitAdapter failed): the GPU it names is then resolved for the decision."""
    kind = event.record_kind
    return kind in GPU_RECORDS and not (kind == "xid" and event.xid is None)


def reset_done(event: DriverCall) -> tuple[bool, int | None]:
    """Whether a driver call is a reset that returned NV_OK, and the device minor it was
    sent to (None: a control node, so the reset is of the GPUs its process held)."""
    if reset_kind(event.sub_name) != "reset" or event.ret != 0 or event.status != 0:
        return False, None      # a request, or a reset call that failed: no reset happened
    kind, minor = classify_device(event.path)
    return True, minor if kind == "nvidiaN" else None


@dataclass(frozen=True)
class SampleSigns:
    """What a GPU sample says is wrong (kept windows included): an uncorrectable error
    (``bad``: its cause), throttling reason bits, an SBE storm, a pending row remap (and
    whether the source flagged it itself), a failed or unhealthy fabric."""

    bad: str | None = None
    throttled: int = 0
    storm: bool = False
    pending: bool = False
    flagged: bool = False
    fabric: bool = False

    @property
    def quiet(self) -> bool:
        """Nothing wrong: such a sample moves only a GPU that is not ok (the common case,
        once a second per GPU, asks the store for no more than the GPU's state)."""
        return not (self.bad or self.throttled or self.storm or self.pending or self.fabric)


def _as_stored(value: dict[str, Any]) -> dict[str, Any]:
    """A dict as the store gives it back once written (JSON, unknown types as text)."""
    loaded: dict[str, Any] = json.loads(json.dumps(value, sort_keys=True, default=str))
    return loaded


class HealthDecider:
    """Decides each GPU's health from events and the store's facts (see the module
    docstring); holds no database. ``host_boot``: the host's boot id, the boot a live event
    happens in (None: unknown)."""

    def __init__(self, host_boot: str | None = None) -> None:
        self.host_boot = host_boot
        self.boot: str | None = None        # the last boot id an event carried
        # Per GPU: recent (ts, corrected ECC count) for the SBE-storm window and the last
        # uncorrectable remapped-rows count.
        self.sbe: dict[str, deque[tuple[int, float]]] = {}
        self.remapped: dict[str, float] = {}

    # --- what the store reads for a decision ------------------------------------------------
    def new_boot(self, boot_id: str | None) -> bool:
        """Whether an event's boot id is a reboot not yet seen: its decision then needs every
        GPU that is not ok (:attr:`HealthFacts.not_ok`)."""
        return bool(boot_id) and boot_id != self.boot

    def sample_signs(self, event: GpuSample) -> SampleSigns | None:
        """What a sample says is wrong, its windows kept (call once per sample); None for a
        MIG instance's (the whole GPU's sample speaks for it)."""
        if event.instance:
            return None
        gpu_id, ts, fields = event.gpu_id, event.ts, event.fields
        bad = gh.uncorrectable(fields)
        throttled = gh.throttling(fields)
        sbe, remapped = fields.get("ecc_sbe_volatile"), fields.get("row_remap_uncorrectable")
        storm = sbe is not None and self._sbe_storm(gpu_id, ts, sbe)
        # The source's own flag where it has one; else a rise of the uncorrectable count.
        flagged = gh.remap_pending(fields)
        pending = (remapped is not None and self._remap_pending(gpu_id, remapped)) or flagged
        return SampleSigns(bad, throttled, storm, pending, flagged, gh.fabric_fault(fields))

    # --- decisions --------------------------------------------------------------------------
    def host_boot_seen(self, ts: int, not_ok: tuple[GpuHealthNow, ...]) -> list[Step]:
        """At the first event after start (at ``ts``): the host booted since every state
        entered in another boot (whether or not a kernel-log source saw it), so that reboot
        clears them, dated at this event (when the reboot happened is not known), never
        before the state it clears."""
        run = _Run(self, HealthFacts(not_ok=not_ok), None)
        for row in not_ok:
            entered_in = row.boot_id
            if entered_in and entered_in != self.host_boot:
                run.move(row.gpu_id, max(ts, row.since or 0), gh.OK, "reboot",
                         {"event": "host boot id at start", "boot_id_before": entered_in,
                          "boot_id_now": self.host_boot}, how=gh.BY_REBOOT)
        return run.steps

    def decide(self, event: Event, facts: HealthFacts) -> list[Step]:
        """The steps one event (not a sample: :meth:`sample`) decides, from ``facts``."""
        run = _Run(self, facts, getattr(event, "boot_id", None) or None)
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(run, event)
        return run.steps

    def sample(self, event: GpuSample, signs: SampleSigns, now: GpuHealthNow | None
               ) -> list[Step]:
        """The steps a sample decides, from its signs (:meth:`sample_signs`) and its GPU's
        current health ``now``."""
        gpu_id, ts, fields = event.gpu_id, event.ts, event.fields
        run = _Run(self, HealthFacts({gpu_id: now}), None)
        said = gh.sample_causes(fields)
        fabric = [c for c in (gh.FABRIC_FAILED, gh.FABRIC_UNWELL) if said.get(c)]
        evidence = {"event": "gpu_sample", "source": event.source}
        state = now.state if now else gh.OK
        later = now is not None and ts > (now.since or 0)
        if now is None:
            pass                # a GPU with no health row yet: only an escalation below
        elif later and fields and signs.bad is None and state in (gh.LOST, gh.RESETTING):
            run.read_again(gpu_id, ts, now, "source reads it again with clean counters",
                           evidence)
        elif later and state == gh.DEGRADED:
            # each cause a sample clears ends when a sample says it no longer holds
            causes = list(now.evidence.get("causes", []))
            ended = [c for c in causes if c in gh.SAMPLE_CLEARED_CAUSES and said.get(c) is False]
            if ended:
                kept = [c for c in causes if c not in ended]
                why = "; ".join(gh.ENDED[c] for c in ended)
                if kept:
                    run.move(gpu_id, ts, gh.DEGRADED, why, evidence, kept)
                else:
                    run.move(gpu_id, ts, gh.OK, why, evidence)
        if signs.bad is not None:
            run.escalate(gpu_id, ts, gh.RESET_REQUIRED, signs.bad, {
                **evidence, "ecc_dbe_volatile": fields.get("ecc_dbe_volatile"),
                "row_remap_failed": fields.get("row_remap_failed")})
        if signs.throttled:
            run.escalate(gpu_id, ts, gh.DEGRADED, gh.THROTTLING,
                         {**evidence, "clocks_event_reasons": hex(signs.throttled)})
        if signs.storm:
            run.escalate(gpu_id, ts, gh.DEGRADED, gh.SBE_STORM,
                         {**evidence, "ecc_sbe_volatile": fields.get("ecc_sbe_volatile"),
                          "window_s": gh.SBE_STORM_WINDOW_NS // 10**9})
        if signs.pending:
            run.escalate(gpu_id, ts, gh.DEGRADED, gh.ROW_REMAP_PENDING,
                         {**evidence, "row_remap_uncorrectable":
                             fields.get("row_remap_uncorrectable"),
                          **({"row_remap_pending": 1} if signs.flagged else {})})
        for cause in fabric:
            run.escalate(gpu_id, ts, gh.DEGRADED, cause, {**evidence, **_fabric_named(fields)})
        return run.steps

    # --- the windows ------------------------------------------------------------------------
    def forget_counters(self, gpu_id: str) -> None:
        """A reset or reboot clears the volatile counters the sample windows were built on."""
        self.sbe.pop(gpu_id, None)
        self.remapped.pop(gpu_id, None)

    def _remap_pending(self, gpu_id: str, remapped: float | None) -> bool:
        """Whether the uncorrectable remapped-rows count went up: a row waits for a reset."""
        if remapped is None:
            return False
        before = self.remapped.get(gpu_id)
        self.remapped[gpu_id] = remapped
        return before is not None and remapped > before

    def _sbe_storm(self, gpu_id: str, ts: int, count: float | None) -> bool:
        if count is None:
            return False
        window = self.sbe.setdefault(gpu_id, deque())
        if window and count < window[-1][1]:
            window.clear()      # the volatile counter went back: the GPU was reset
        window.append((ts, count))
        while window and window[0][0] < ts - gh.SBE_STORM_WINDOW_NS:
            window.popleft()
        return window[-1][1] - window[0][1] >= gh.SBE_STORM_COUNT


class _Run:
    """One event's decision in progress: the steps so far and each GPU's health as they
    leave it (what the store would read back after applying them)."""

    def __init__(self, decider: HealthDecider, facts: HealthFacts,
                 event_boot: str | None) -> None:
        self.decider = decider
        self.facts = facts
        self.event_boot = event_boot
        self.gpus: dict[str, GpuHealthNow | None] = {
            **{row.gpu_id: row for row in facts.not_ok or ()}, **facts.gpus}
        self.steps: list[Step] = []

    def now(self, gpu_id: str) -> GpuHealthNow | None:
        try:
            return self.gpus[gpu_id]
        except KeyError:
            raise LookupError(f"GPU {gpu_id!r}: its health is not among the facts") from None

    def boot_id(self) -> str | None:
        """The boot a new state is entered in: the event's own (a kernel-log or cron event
        says which boot it was logged in), else the host's, else the last one an event
        carried (None: the caller fills in the store's)."""
        return self.event_boot or self.decider.host_boot or self.decider.boot

    def move(self, gpu_id: str, ts: int, state: str, cause: str, evidence: dict[str, Any],
             causes: list[str] | None = None, pci: str | None = None,
             how: str | None = None, remedies: frozenset[str] | None = None) -> None:
        """Decide a transition (or, within degraded, a changed set of causes). ``how``: the
        remedy that cleared the state it leaves (the new state then waits for its own
        remedies only); ``remedies``: what the new state waits for, where the caller worked
        it out (a state kept, waiting for less)."""
        current = self.now(gpu_id)
        previous = (current.health if current else None) or gh.OK
        if remedies is None:
            remedies = gh.remedies(state, cause) if how else gh.entry_remedies(
                gh.remedies(state, cause), previous,
                gh.stored_remedies(previous, current.evidence if current else {}))
        step = gh.Transition(
            gpu_id, ts, state, previous, cause,
            {**evidence, **({"causes": causes} if causes is not None else {})},
            remedies, how, self.boot_id(), pci)
        self.steps.append(step)
        self.gpus[gpu_id] = GpuHealthNow(gpu_id, state, ts, _as_stored(step.body()),
                                         step.boot_id, current.source if current else None)
        if state in (gh.OK, gh.RESETTING):
            self.decider.forget_counters(gpu_id)

    def contradict(self, gpu_id: str, seen: dict[str, Any]) -> None:
        self.steps.append(gh.Contradiction(gpu_id, seen))
        current = self.now(gpu_id)
        if current is not None:
            self.gpus[gpu_id] = replace(current, evidence={
                **current.evidence, "contradicted": _as_stored(seen)})

    def escalate(self, gpu_id: str | None, ts: int, state: str, cause: str,
                 evidence: dict[str, Any], pci: str | None = None,
                 own: frozenset[str] = frozenset()) -> None:
        """Move to ``state`` if it is worse than the current one; within degraded, add the
        cause (each degraded cause clears its own way). ``own``: what the fact asks for
        where its catalogue fields said (an Xid), else the state's rule for its cause."""
        if not gpu_id:
            return
        current = self.now(gpu_id)
        now = (current.health if current else None) or gh.OK
        if state == gh.DEGRADED and now == gh.DEGRADED and current is not None:
            causes = list(current.evidence.get("causes", []))
            if cause not in causes:
                self.move(gpu_id, ts, gh.DEGRADED, cause, evidence, [*causes, cause])
            return
        own = own or gh.remedies(state, cause)
        waits = gh.stored_remedies(now, current.evidence if current else {})
        if gh.RANK[state] > gh.RANK[now]:
            self.move(gpu_id, ts, state, cause, evidence,
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
                self.move(gpu_id, ts, now, cause, {**evidence, "kept": now}, pci=pci,
                          remedies=narrower)

    def reset_seen(self, gpu_id: str, ts: int, evidence: dict[str, Any],
                   done: bool = False) -> None:
        """A reset (gpuwhy/reset.py): resetting until the GPU source reads the GPU again;
        ``done`` (a reset call returned NV_OK on a GPU no source reads) goes on to ok. A
        state that waits for a reboot (the catalogue says so: Xid 79, a reboot-class Xid)
        is not cleared by a reset: it stays as it is."""
        current = self.now(gpu_id)
        now = (current.health if current else None) or gh.OK
        waits = gh.stored_remedies(now, current.evidence if current else {})
        if now not in (gh.OK, gh.RESETTING) and not gh.clears_by(gh.BY_RESET, now, waits):
            return              # a GPU reset does not clear what only a reboot clears
        self.move(gpu_id, ts, gh.RESETTING, "reset", evidence,
                  how=gh.BY_RESET if now != gh.OK else None)
        if done and not (current and current.source):
            self.move(gpu_id, ts, gh.OK, "reset done", {
                **evidence, "why": "the reset call returned NV_OK and no GPU source reads "
                                   "this GPU to say otherwise"}, how=gh.BY_RESET)

    def boot_seen(self, boot_id: str, ts: int) -> None:
        """A new boot id is a reboot: it clears every state entered in an older boot."""
        # Compared with each GPU's own boot, not only the last one seen: after a reboot the
        # first batch already carries the new cursor, so the store's "last boot" is new too.
        if not self.decider.new_boot(boot_id):
            return
        before, self.decider.boot = self.decider.boot, boot_id
        if self.facts.not_ok is None:
            raise LookupError(f"boot {boot_id}: the GPUs not ok are not among the facts")
        for row in self.facts.not_ok:
            entered_in, since = row.boot_id, row.since
            if entered_in and entered_in != boot_id and (since or 0) <= ts:
                self.move(row.gpu_id, ts, gh.OK, "reboot",
                          {"event": "boot id changed", "boot_id_before": entered_in,
                           "boot_id_now": boot_id, "last_boot_seen": before},
                          how=gh.BY_REBOOT)

    def xid(self, gpu_id: str | None, ts: int, code: int, catalogue: dict[str, Any],
            evidence: dict[str, Any], pci: str | None = None) -> None:
        target = gh.xid_target(code, catalogue)
        if target is None:
            return              # its action needs no reset or reboot: health unchanged
        state, cause = target
        self.escalate(gpu_id, ts, state, cause,
                      {**evidence, "xid": code, "title": catalogue.get("title", "")}, pci,
                      own=gh.xid_remedies(catalogue) if state != gh.DEGRADED else frozenset())

    def read_again(self, gpu_id: str, ts: int, current: GpuHealthNow, cause: str,
                   evidence: dict[str, Any]) -> None:
        """The GPU source read a lost or resetting GPU again: ok where reading is what the
        state waits for (the end of a reset, how: ``reset``; a loss only the source said,
        how: ``read``); else, on a GPU the kernel says fell off the bus, contradicting
        evidence, kept once, never a recovery."""
        now = current.state
        waits = gh.stored_remedies(now, current.evidence)
        if now == gh.RESETTING:
            # the reset it waited for has ended: the source reads the GPU clean after it
            self.move(gpu_id, ts, gh.OK, cause, evidence, how=gh.BY_RESET)
        elif gh.clears_by(gh.BY_READ, now, waits):
            self.move(gpu_id, ts, gh.OK, cause, evidence, how=gh.BY_READ)
        elif now == gh.LOST and "contradicted" not in current.evidence:
            self.contradict(gpu_id, {**evidence, "ts": ts, "state": now,
                                     "state_cause": current.evidence.get("cause"),
                                     "clears_by": sorted(waits)})


# --- the sources ------------------------------------------------------------------------------
def _kernel_log_record(run: _Run, event: KernelLogRecord) -> None:
    run.boot_seen(event.boot_id, event.ts)
    if not names_gpu(event):
        return
    kind = event.record_kind
    gpu_id = run.facts.named[0] if run.facts.named else None
    evidence = {"event": f"kernel log {kind}", "origin": event.origin, "cursor": event.cursor,
                "line": (event.line or event.message or "")[:MAX_DETAIL]}
    if kind == "rm_init_failed":
        run.escalate(gpu_id, event.ts, gh.RESET_REQUIRED, "rm_init_failed", evidence,
                     event.pci)
        return
    code = event.xid if kind == "xid" and event.xid is not None else 79
    run.xid(gpu_id, event.ts, code, catalogue_fields(kind, code, event.details), evidence,
            event.pci)


def _kernel_log_checkpoint(run: _Run, event: KernelLogCheckpoint) -> None:
    run.boot_seen(event.boot_id, event.ts)


def _cron_execution(run: _Run, event: CronExecution) -> None:
    run.boot_seen(event.boot_id, event.ts)


def _gpu_xid(run: _Run, event: GpuXid) -> None:
    if event.before_start:
        return              # from before gpuwhy started: when, and whether a reset has
        # cleared it since, nobody can tell (the GPU page shows it as a note)
    run.xid(event.gpu_id, event.ts, event.xid, xid_info(event.xid).as_fields(),
            {"event": "gpu_xid", "source": event.source, "detail": event.detail[:MAX_DETAIL]})


def _gpu_state(run: _Run, event: GpuState) -> None:
    evidence = {"event": f"gpu_state {event.state}", "source": event.source,
                "detail": event.detail[:MAX_DETAIL]}
    if event.state == gh.LOST:
        run.escalate(event.gpu_id, event.ts, gh.LOST, gh.SOURCE_LOST, evidence)
    elif event.state == gh.RESET_REQUIRED:
        run.escalate(event.gpu_id, event.ts, gh.RESET_REQUIRED, "source says reset required",
                     evidence)
    elif state_kind(event.state) == "reset":
        run.reset_seen(event.gpu_id, event.ts, evidence)
    elif state_kind(event.state) == "back":
        current = run.now(event.gpu_id)
        if current and current.health in (gh.LOST, gh.RESETTING) and \
                event.ts >= (current.since or 0):
            run.read_again(event.gpu_id, event.ts, current, "source reads it again", evidence)


def _driver_call(run: _Run, event: DriverCall) -> None:
    done, _minor = reset_done(event)
    if not done:
        return
    evidence = {"event": f"driver call {event.sub_name}", "pid": event.process.pid,
                "start_time": event.process.start_time, "path": event.path}
    for gpu_id in run.facts.named:
        if gpu_id:
            run.reset_seen(gpu_id, event.ts, evidence, done=True)


_HANDLERS: dict[str, Callable[[_Run, Any], None]] = {
    KernelLogRecord.kind: _kernel_log_record,
    KernelLogCheckpoint.kind: _kernel_log_checkpoint,
    CronExecution.kind: _cron_execution,
    GpuXid.kind: _gpu_xid,
    GpuState.kind: _gpu_state,
    DriverCall.kind: _driver_call,
}


def _fabric_named(fields: dict[str, float]) -> dict[str, str]:
    """The NVLink fabric's state and health a sample read, by name ("Failure", "Unhealthy")."""
    named = {}
    for name, table in (("fabric_state", FABRIC_STATES), ("fabric_health", FABRIC_HEALTH)):
        if fields.get(name) is not None:
            named[name] = table.get(int(fields[name]), str(fields[name]))
    return named
