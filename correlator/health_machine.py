"""The GPU health state machine: every source's events move a GPU between the states of
:mod:`gpuwhy.gpu_health`, each transition stored with its evidence and what clears it.

Runs in the decide stage (``IncidentBuilder.decide`` calls :meth:`GpuHealth.observe` for
every event), inside the batch's transaction: a transition commits with the events it rests
on. Sources and what they mean:

- kernel log: an Xid (its catalogue entry, :func:`gpuwhy.xid.catalogue_fields`), fallen off
  the bus, RmInitAdapter failed; every kernel-log and cron event carries the boot id, and a
  new one is a reboot, which clears every state entered in an older boot;
- the host: its boot id (:mod:`gpuwhy.boot`), read once at start by the application that
  runs this stage and handed in as a value, is the boot every other event happens in, so
  a reboot is seen without a kernel-log source: at the first event after start, every
  state entered in another boot is cleared by that reboot;
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

Decisions are values: for each event :class:`GpuHealth` reads what the decision needs
through the store (:func:`gpuwhy.store.health.health_facts`: the current health of the GPUs
the event names, every GPU not ok where a new boot id came), has the pure
:class:`gpuwhy.correlator.health_decide.HealthDecider` decide from those plain values, and
has the store apply what it returned (:func:`gpuwhy.store.health.apply_health`): each move a
:class:`gpuwhy.gpu_health.Transition`, each contradicting sign a
:class:`gpuwhy.gpu_health.Contradiction`, kept in :attr:`GpuHealth.transitions` and
:attr:`GpuHealth.contradicted` for the incidents that rest on the GPU's health
(``IncidentBuilder`` resolves them by it).

The current state lives on the GPU's ``gpus`` row and is read from there for each event
(cached only within a decide: :meth:`GpuHealth.forget`), so a decide that fails and rolls
back leaves nothing stale behind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlite_utils import Database

from gpuwhy import gpu_health as gh
from gpuwhy.correlator.health_decide import (
    KINDS,
    HealthDecider,
    Step,
    names_gpu,
    reset_done,
)
from gpuwhy.events import (
    CronExecution,
    DriverCall,
    Event,
    GpuSample,
    GpuXid,
    KernelLogCheckpoint,
    KernelLogRecord,
)
from gpuwhy.store import gpu_bindings, queries
from gpuwhy.store import health as store_health
from gpuwhy.store.health import HealthFacts


class GpuHealth:
    """Decides each GPU's health from the events of a batch (see the module docstring): reads
    the facts through the store, decides with :class:`HealthDecider`, applies through the
    store."""

    def __init__(self, host_boot: str | None = None) -> None:
        # The host's boot (gpuwhy.boot, read by the application that runs this stage; None in
        # a replay): the boot a live event happens in. Older boots' states are cleared at the
        # first event (the constructor has no store).
        self.decider = HealthDecider(host_boot)
        self._host_boot_checked = self.decider.host_boot is None
        self._stored_boot: str | None = None    # the kernel-log source's, read once if needed
        # Each GPU's health as read or moved in the running decide: a sample with nothing
        # wrong asks only this (a SELECT per sample was a tenth of the decide stage).
        # ``forget()`` at each decide, and after anything else that may rewrite GPU rows.
        self._states: dict[str, str | None] = {}
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
        return kind in KINDS

    def first_seen(self, db: Database, ts: int) -> None:
        """An event at ``ts`` is about to be observed: the host's boot is checked at the first."""
        if not self._host_boot_checked:
            self._host_boot_checked = True
            self._apply(db, self.decider.host_boot_seen(ts, store_health.not_ok_now(db)))

    def observe(self, db: Database, event: Event) -> None:
        """Apply one event (already written by the store's writer) to its GPU's health."""
        self.first_seen(db, event.ts)
        if event.kind not in KINDS:
            return
        if isinstance(event, GpuSample):
            signs = self.decider.sample_signs(event)
            if signs is None or (signs.quiet and self._state(db, event.gpu_id) in
                                 (None, gh.OK)):
                return          # the common case, once a second per GPU: kept cheap
            self._apply(db, self.decider.sample(
                event, signs, store_health.health_now(db, event.gpu_id)))
            return
        facts = self._facts(db, event)
        if facts is not None:
            self._apply(db, self.decider.decide(event, facts))

    def _facts(self, db: Database, event: Event) -> HealthFacts | None:
        """What the decision of ``event`` reads: the GPUs it names, resolved, with their
        health; every GPU not ok where it brings a new boot id. None where the event can
        move nothing (a driver call that is no reset done, a log line or cron run of a
        boot already seen that names no GPU, an Xid from before the start)."""
        named: tuple[str | None, ...] = ()
        not_ok = False
        if isinstance(event, (KernelLogRecord, KernelLogCheckpoint, CronExecution)):
            not_ok = self.decider.new_boot(event.boot_id)
            if isinstance(event, KernelLogRecord) and names_gpu(event):
                named = (queries.resolve_gpu(db, uuid=event.uuid, pci=event.pci),)
            elif not not_ok:
                return None
        elif isinstance(event, DriverCall):
            done, minor = reset_done(event)
            if not done:
                return None
            named = (queries.resolve_gpu(db, minor=minor),) if minor is not None else \
                tuple(gpu_bindings.gpus_of(db, event.process, event.ts))
        elif isinstance(event, GpuXid) and event.before_start:
            return None
        else:                   # a GPU source's Xid or state names its GPU
            named = (getattr(event, "gpu_id", None),)
        return store_health.health_facts(db, named, not_ok)

    def _apply(self, db: Database, steps: list[Step]) -> None:
        """Have the store apply a decision's steps, and keep them for :meth:`take`. A move
        made where no boot is known takes the kernel-log source's stored one."""
        if not steps:
            return
        steps = [replace(step, boot_id=self._stored_boot_id(db))
                 if isinstance(step, gh.Transition) and step.boot_id is None else step
                 for step in steps]
        store_health.apply_health(db, steps)
        for step in steps:
            if isinstance(step, gh.Transition):
                self.transitions.append(step)
                self._states[step.gpu_id] = step.state
            else:
                self.contradicted.append(step)

    def _stored_boot_id(self, db: Database) -> str | None:
        """The boot id the kernel-log source last read in (read once; None where none is
        known)."""
        if self._stored_boot is None:
            self._stored_boot = queries.last_boot_id(db) or ""
        return self._stored_boot or None
