"""GPU health reads and writes: what a health decision needs, the transitions it decided.

The store reads what the decide stage's health machine decides from
(:class:`GpuHealthNow`, :class:`HealthFacts`), applies what it (or an operator's
mark-healthy) decided (:class:`gpuwhy.gpu_health.Transition`,
:class:`gpuwhy.gpu_health.Contradiction`: :func:`apply_health`), and reads the incidents that
rest on a GPU's health.

A health-backed incident is a cause incident (not an effect) about a GPU that is unusable
until something clears it: a lost GPU (``gpu_lost``), or an Xid whose catalogue action is a
GPU reset or a reboot. It is open exactly while its GPU's health is unusable
(:data:`gpuwhy.gpu_health.UNUSABLE`) and is resolved by the transition that ends that, with
the same how (:data:`gpuwhy.gpu_health.RESOLUTION`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from gpuwhy import gpu_health as gh
from gpuwhy import lifecycle as lc
from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.reset import sql_names
from gpuwhy.store.incident_log import log_change, mark_resolved
from gpuwhy.store.queries import gpu_health


def health_backed_sql(alias: str = "") -> str:
    """The SQL test for a health-backed incident, the incidents whose lifecycle follows their
    GPU's health (``alias``: the incidents table's, with its dot, in a join); whether it is
    a cause or an effect is the caller's test."""
    return (f"({alias}kind = 'gpu_lost' or ({alias}kind = 'xid' and "
            f"(json_extract({alias}details, '$.gpu_reset') or "
            f"json_extract({alias}details, '$.reboot'))))")


HEALTH_BACKED_SQL = health_backed_sql()


@dataclass(frozen=True)
class GpuHealthNow:
    """A GPU's health as stored: ``health`` (None before any transition: ok), since when,
    the stored evidence (what it waits for in ``clears_by``, ``causes`` within degraded, a
    ``contradicted`` sign), the boot it was entered in, and the GPU source that reads the
    GPU (None: no source reads it, such as a GPU only the kernel log named)."""

    gpu_id: str
    health: str | None = None
    since: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    boot_id: str | None = None
    source: str | None = None

    @property
    def state(self) -> str:
        return self.health or gh.OK


@dataclass(frozen=True)
class HealthFacts:
    """What one event's health decision reads from the store: the current health of each
    GPU it may move (None: no ``gpus`` row yet), the GPU ids the event names once resolved
    (a kernel-log line's UUID or PCI address, a reset call's device or the GPUs its process
    held; None where nothing resolved), and, where the event brings a new boot id, every GPU
    whose health is not ok (None: not read, the event brings no new boot)."""

    gpus: Mapping[str, GpuHealthNow | None] = field(default_factory=dict)
    named: tuple[str | None, ...] = ()
    not_ok: tuple[GpuHealthNow, ...] | None = None


def _now_of(row: Mapping[str, Any]) -> GpuHealthNow:
    return GpuHealthNow(row["id"], row["health"], row["since"],
                        json.loads(row["health_evidence"] or "{}"), row["boot_id"],
                        row["source"])


_NOW_COLUMNS = ("select id, health, health_since as since, health_evidence, "
                "health_boot_id as boot_id, source from gpus")


def health_now(db: Database, gpu_id: str) -> GpuHealthNow | None:
    """A GPU's current health (:func:`gpuwhy.store.queries.gpu_health` as a value), None
    for a GPU with no row."""
    found = db.execute_returning_dicts(f"{_NOW_COLUMNS} where id = ?", [gpu_id])
    return _now_of(found[0]) if found else None


def not_ok_now(db: Database) -> tuple[GpuHealthNow, ...]:
    """Every GPU whose health is not ok, by id: those a reboot may clear."""
    return tuple(_now_of(row) for row in db.execute_returning_dicts(
        f"{_NOW_COLUMNS} where health is not null and health != 'ok' order by id"))


def health_facts(db: Database, named: Iterable[str | None] = (), not_ok: bool = False
                 ) -> HealthFacts:
    """The facts a health decision reads: the current health of each of the ``named`` GPUs
    (already resolved; None skipped) and, with ``not_ok``, of every GPU not ok."""
    ids = tuple(named)
    gpus = {gpu_id: health_now(db, gpu_id) for gpu_id in dict.fromkeys(ids)
            if gpu_id is not None}
    return HealthFacts(gpus, ids, not_ok_now(db) if not_ok else None)


def apply_health(db: Database, steps: Sequence[gh.Transition | gh.Contradiction]) -> None:
    """Apply one decision's steps in order: each transition (:func:`apply_transition`) and
    each contradicting sign (:func:`note_contradiction`)."""
    for step in steps:
        if isinstance(step, gh.Transition):
            apply_transition(db, step)
        else:
            note_contradiction(db, step.gpu_id, step.seen)


class HealthError(GpuwhyError):
    """A mark-healthy the GPU's state does not allow (no such GPU, ok already), or a name or
    reason that is empty or too long."""


def apply_transition(db: Database, move: gh.Transition) -> None:
    """Write one decided transition: the GPU's current health and a history row."""
    # A GPU only the kernel log or a driver call named gets a row, so that the overview and
    # /metrics show it (its id is its PCI address until a source names it).
    db.execute("insert into gpus (id, pci_bus_id, first_seen, last_seen) values "
               "(?, ?, ?, ?) on conflict(id) do nothing",
               [move.gpu_id, move.pci, move.ts, move.ts])
    body = json.dumps(move.body(), sort_keys=True, default=str)
    clears = move.clears
    db.execute("update gpus set health = ?, health_since = ?, health_evidence = ?, "
               "health_clears = ?, health_boot_id = ? where id = ?",
               [move.state, move.ts, body, clears, move.boot_id, move.gpu_id])
    db.table("gpu_health_history").insert({
        "gpu_id": move.gpu_id, "ts": move.ts, "state": move.state, "previous": move.previous,
        "cause": move.cause, "evidence": body, "clears": clears, "boot_id": move.boot_id})


def note_contradiction(db: Database, gpu_id: str, seen: dict[str, Any]) -> None:
    """Keep, on the GPU's current state, the first sign that contradicts it (a source still
    reading a GPU the kernel says fell off the bus): evidence, not a transition."""
    db.execute("update gpus set health_evidence = json_set(coalesce(health_evidence, '{}'), "
               "'$.contradicted', json(?)) where id = ?",
               [json.dumps(seen, sort_keys=True, default=str), gpu_id])


def note_incident_contradiction(db: Database, incident_id: int, seen: dict[str, Any]) -> None:
    """Keep the contradicting sign on the incident itself, where its chain reads it (the
    GPU's evidence is replaced by its next transition; the incident's story is not)."""
    db.execute("update incidents set details = json_set(coalesce(details, '{}'), "
               "'$.contradicted', json(?)) where id = ?",
               [json.dumps(seen, sort_keys=True, default=str), incident_id])


def active_health_incidents(db: Database, gpu_id: str) -> list[int]:
    """The active health-backed cause incidents of ``gpu_id``, oldest first."""
    return [r[0] for r in db.execute(
        f"select id from incidents where gpu_id = ? and cause_id is null and "
        f"{lc.sql_active()} and {HEALTH_BACKED_SQL} order by opened_at, id", [gpu_id])]


def last_clearing(db: Database, gpu_id: str, after: int) -> tuple[int, str, str] | None:
    """(ts, how, cause) of the latest transition at or after ``after`` that made the GPU
    usable again, None when there is none."""
    unusable = sql_names(gh.UNUSABLE)
    row = db.execute(
        f"select ts, json_extract(evidence, '$.how'), cause from gpu_health_history where "
        f"gpu_id = ? and ts >= ? and previous in {unusable} and state not in {unusable} "
        f"order by ts desc, id desc limit 1", [gpu_id, after]).fetchone()
    return (row[0], row[1] or gh.BY_READ, row[2]) if row else None


def _text(value: str | None, what: str, limit: int) -> str:
    value = (value or "").strip()
    if not value:
        raise HealthError(f"a mark-healthy needs {what}")
    if len(value) > limit or "\x00" in value:
        raise HealthError(f"the {what} is too long (at most {limit} characters) or holds NUL")
    return value


def mark_healthy(db: Database, gpu_id: str, by: str, why: str,
                 ts: int | None = None) -> dict[str, Any]:
    """An operator says the GPU is healthy (replaced, checked, reseated): its health goes to
    ok with who and why as the evidence, and its health-backed incidents are resolved as
    ``operator`` by that person with that reason. Returns {gpu, previous, state, incidents,
    log_ids} (log_ids: the incident_log rows, for the journal)."""
    by = _text(by, "who marks it (--by)", lc.ACTOR_MAX)
    why = _text(why, "a reason (--why)", lc.NOTE_MAX)
    ts = now_ns() if ts is None else ts
    with db.atomic():
        current = gpu_health(db, gpu_id)
        if current is None:
            raise HealthError(f"no GPU {gpu_id} in the store (see `gpuwhy status`)")
        # dated now, never before the state it clears (a clock behind the events' own)
        ts = max(ts, current["since"] or 0)
        move = gh.marked_healthy(gpu_id, current["health"], by, why, ts)
        if move is None:
            raise HealthError(f"GPU {gpu_id} is ok already: nothing to mark")
        apply_transition(db, move)
        incidents, log_ids = [], []
        for incident_id in active_health_incidents(db, gpu_id):
            incidents.append(incident_id)
            # the cause's change is news for the journal; its effects end with it quietly
            log_ids.append(resolve_with_effects(db, incident_id, lc.OPERATOR, ts, by, why)[0])
    return {"gpu": gpu_id, "previous": move.previous, "state": move.state,
            "incidents": incidents, "log_ids": log_ids}


def operator_resolved(db: Database, incident_id: int, actor: str, text: str | None,
                      ts: int) -> list[int]:
    """An operator resolved ``incident_id`` (inside their change's transaction): if it rests
    on its GPU's health and the GPU is still unusable, that is the operator saying the GPU
    is healthy, so its health follows (a mark-healthy with the same who and why) and its
    other health-backed incidents end with it, so that incident and health never disagree.
    Returns those other incidents' log row ids."""
    row = db.execute(f"select gpu_id from incidents where id = ? and cause_id is null and "
                     f"{HEALTH_BACKED_SQL}", [incident_id]).fetchone()
    if row is None or row[0] is None:
        return []
    gpu_id = row[0]
    current = gpu_health(db, gpu_id)
    if current is None or current["health"] not in gh.UNUSABLE:
        return []
    why = text or f"resolved incident {incident_id}"
    move = gh.marked_healthy(gpu_id, current["health"], actor,
                             f"{why} (incident {incident_id} resolved)",
                             max(ts, current["since"] or 0))
    if move is None:
        return []
    apply_transition(db, move)
    return [resolve_with_effects(db, other, lc.OPERATOR, ts, actor, why)[0]
            for other in active_health_incidents(db, gpu_id)]


def resolve_with_effects(db: Database, incident_id: int, how: str, ts: int, actor: str,
                         why: str) -> list[int]:
    """Resolve an active incident and its active effects (they end with their cause);
    returns the cause's log row id first, then its effects'."""
    mark_resolved(db, incident_id, how, ts)
    ids = [log_change(db, incident_id, lc.RESOLVE, ts, actor, how, why)]
    for (effect,) in db.execute(f"select id from incidents where cause_id = ? and "
                                f"{lc.sql_active()}", [incident_id]).fetchall():
        mark_resolved(db, effect, how, ts)
        ids.append(log_change(db, effect, lc.RESOLVE, ts, actor, how,
                                              f"its cause, incident {incident_id}, was "
                                              f"resolved"))
    return ids
