"""Incident rows for the decide stage: the reads it decides on, and the row writes it asks for.

The decide stage (:mod:`gpuwhy.correlator.incidents`, :mod:`gpuwhy.correlator.pending`)
computes what to open, merge, link and resolve from the plain rows read here; the
statements that apply those decisions live here too, run in the batch's transaction.
Lifecycle changes and their log rows are :mod:`gpuwhy.store.incident_changes`'s; health-backed
incidents are :mod:`gpuwhy.store.health`'s.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlite_utils import Database

from gpuwhy.lifecycle import sql_active
from gpuwhy.store.health import HEALTH_BACKED_SQL, health_backed_sql, last_clearing


def settling_ids(db: Database, watermark: int) -> list[int]:
    """Ids of the incidents still taking late events at ``watermark``, oldest first."""
    # sorted here: "order by id" made the planner walk every incident in id order
    # instead of the few still settling (settle_until's index, m117)
    return sorted(r[0] for r in db.execute(
        "select id from incidents where settle_until >= ?", [watermark]))


def settle_now(db: Database, ids: Sequence[int]) -> None:
    """End the settling of ``ids``: they take no more late events."""
    if ids:
        db.execute(f"update incidents set settle_until = null where id in "
                   f"({', '.join('?' * len(ids))})", list(ids))


def active_stalls(db: Database) -> list[tuple[int, str, int]]:
    """(id, dedup_key, opened_at) of every active process-stall incident."""
    return db.execute(
        f"select id, dedup_key, opened_at from incidents indexed by "
        f"idx_incidents_state where {sql_active()} and kind = 'process_stall'").fetchall()


# --- open, merge, reopen ---------------------------------------------------------------------
def latest_active(db: Database, dedup_key: str, seen_since: int) -> tuple | None:
    """(id, count, severity, state) of the latest active incident of ``dedup_key`` last seen
    at or after ``seen_since``."""
    return db.execute(f"select id, count, severity, state from incidents where "
                      f"dedup_key = ? and {sql_active()} and last_seen >= ? "
                      f"order by id desc limit 1", [dedup_key, seen_since]).fetchone()


def latest_to_merge(db: Database, dedup_key: str, closed_since: int) -> tuple | None:
    """(id, count, severity, state) of the latest incident of ``dedup_key`` that is active,
    or was resolved at or after ``closed_since`` while its cause (if any) is still active."""
    return db.execute(f"select i.id, i.count, i.severity, i.state from incidents i "
                      f"left join incidents c on c.id = i.cause_id where "
                      f"i.dedup_key = ? and ({sql_active('i.state')} or "
                      f"(i.closed_at >= ? and (c.id is null or "
                      f"{sql_active('c.state')}))) order by i.id desc limit 1",
                      [dedup_key, closed_since]).fetchone()


@dataclass(frozen=True)
class MergeFacts:
    """What a wanted incident is opened or merged on (:func:`merge_facts`): the incident of
    its dedup key it would merge into (``row``: id, count, severity, state; None: it opens
    one), that incident's details where the repeat may add to them (``details``; None: not
    read), and whether the incident names as many processes as it keeps already
    (``named_full``: its details were not read for the processes the repeat names)."""

    row: tuple | None = None
    details: dict[str, Any] | None = None
    named_full: bool = False


def merge_facts(db: Database, dedup_key: str, active_only: bool, since: int, flags: bool,
                names: bool, named_full: Collection[int]) -> MergeFacts:
    """The rows a wanted incident of ``dedup_key`` is opened or merged on
    (:class:`MergeFacts`): the latest active incident last seen at or after ``since``
    (``active_only``: :func:`latest_active`), else the latest active or resolved at or after
    ``since`` (:func:`latest_to_merge`); its details when the repeat asks for a reset or a
    reboot (``flags``) or names processes (``names``) and the incident is not one of
    ``named_full`` (those that name as many as they keep)."""
    row = latest_active(db, dedup_key, since) if active_only else \
        latest_to_merge(db, dedup_key, since)
    if row is None:
        return MergeFacts()
    full = row[0] in named_full
    read = flags or (names and not full)
    return MergeFacts(tuple(row), details(db, row[0]) if read else None, full)


def merge_repeat(db: Database, incident_id: int, count: int, severity: str, ts: int,
                 settle_until: int) -> None:
    """A repeat merged into the incident: its count and severity, seen at ``ts``."""
    db.execute("update incidents set count = ?, severity = ?, "
               "last_seen = max(last_seen, ?), opened_at = min(opened_at, ?), "
               "settle_until = max(coalesce(settle_until, 0), ?), updated_at = ? "
               "where id = ?", [count, severity, ts, ts, settle_until, ts, incident_id])


def insert_incident(db: Database, row: Mapping[str, Any]) -> int:
    """A new incident row; returns its id."""
    return cast(int, db.table("incidents").insert(dict(row)).last_pk)   # the new rowid


def details(db: Database, incident_id: int) -> dict[str, Any]:
    """The incident's details (its JSON column), parsed."""
    row = db.execute("select details from incidents where id = ?", [incident_id]).fetchone()
    return json.loads(row[0] or "{}")


def set_details(db: Database, incident_id: int, value: Mapping[str, Any]) -> None:
    db.execute("update incidents set details = ? where id = ?",
               [json.dumps(value, sort_keys=True), incident_id])


# --- causes and effects ----------------------------------------------------------------------
def active_causes(db: Database, gpu_id: str, kinds: Sequence[str], opened_by: int) -> list:
    """(id, kind, last_seen, GPU health, pid, start_time) of the GPU's active cause incidents
    of ``kinds`` opened at or before ``opened_by``, latest first."""
    return db.execute(
        f"select i.id, i.kind, i.last_seen, g.health, i.pid, i.start_time "
        f"from incidents i left join gpus g "
        f"on g.id = i.gpu_id where i.gpu_id = ? and i.cause_id is null and "
        f"{sql_active('i.state')} and i.kind in ({', '.join('?' * len(kinds))}) and "
        f"i.opened_at <= ? order by i.opened_at desc",
        [gpu_id, *kinds, opened_by]).fetchall()


def adopt_effects(db: Database, cause_id: int, gpu_id: str | None, kinds: Sequence[str],
                  since: int, until: int) -> int:
    """Link the GPU's active incidents of ``kinds`` opened in [since, until] (and no one's
    effect yet) to ``cause_id``; returns how many."""
    return db.execute(
        f"update incidents set cause_id = ? where gpu_id = ? and cause_id is null and "
        f"id != ? and {sql_active()} and kind in "
        f"({', '.join('?' * len(kinds))}) and opened_at between ? and ?",
        [cause_id, gpu_id, cause_id, *kinds, since, until]).rowcount


def effect_joined(db: Database, cause_id: int, ts: int, settle_until: int) -> None:
    """An effect joined the cause at ``ts``: it is updated, and settles until then at least."""
    db.execute("update incidents set updated_at = max(coalesce(updated_at, 0), ?), "
               "settle_until = max(coalesce(settle_until, 0), ?) where id = ?",
               [ts, settle_until, cause_id])


def is_cause(db: Database, incident_id: int) -> bool:
    """True for an incident that is no other incident's effect."""
    row = db.execute("select cause_id from incidents where id = ?", [incident_id]).fetchone()
    return bool(row) and row[0] is None


def active_effects(db: Database, incident_id: int) -> list[int]:
    """Ids of the active incidents that are effects of ``incident_id``."""
    return [r[0] for r in db.execute(f"select id from incidents where cause_id = ? and "
                                     f"{sql_active()}", [incident_id]).fetchall()]


def needing_reset(db: Database, gpu_id: str, opened_by: int) -> int | None:
    """The GPU's latest active health-backed cause incident opened at or before
    ``opened_by`` (lost; an Xid whose catalogue action is a reset or a reboot)."""
    row = db.execute(
        f"select id from incidents where gpu_id = ? and cause_id is null and "
        f"{sql_active()} and opened_at <= ? and {HEALTH_BACKED_SQL} "
        f"order by opened_at desc limit 1", [gpu_id, opened_by]).fetchone()
    return row[0] if row else None


def latest_cause_opened(db: Database, gpu_id: str, since: int, until: int) -> tuple | None:
    """(id, kind, title, details, pid, start_time, GPU health) of the GPU's latest cause
    incident (any state) opened in [since, until]."""
    return db.execute(
        "select i.id, i.kind, i.title, i.details, i.pid, i.start_time, g.health from "
        "incidents i left join gpus g on g.id = i.gpu_id where i.gpu_id = ? and "
        "i.kind in ('xid', 'gpu_lost', 'gpu_reset') and i.cause_id is null and "
        "i.opened_at between ? and ? order by i.opened_at desc limit 1",
        [gpu_id, since, until]).fetchone()


# --- what ends incidents -----------------------------------------------------------------------
def ended_with_process(db: Database, now: int) -> list[tuple]:
    """(id, process exited_at, kind, GPU health) of active stalls, and settled (before
    ``now``) Xid causes that name a process, whose process ended after they opened."""
    return db.execute(
        f"select i.id, p.exited_at, i.kind, g.health from incidents i join processes p "
        f"on p.pid = i.pid and p.start_time = i.start_time left join gpus g on "
        f"g.id = i.gpu_id where {sql_active('i.state')} and "
        f"p.exited_at is not null and p.exited_at >= i.opened_at and "
        f"(i.kind = 'process_stall' or (i.kind = 'xid' and i.cause_id is null and "
        f"coalesce(i.settle_until, 0) < ?))", [now]).fetchall()


def settled_causes(db: Database, now: int) -> list[tuple]:
    """(id, kind, gpu_id, opened_at, last_seen, GPU health, health-backed) of the active
    cause incidents (Xid, lost, reset) settled before ``now``."""
    # the active incidents by their state's index (m117): the planner, without the
    # store's statistics, took cause_id's, and read every incident ever kept each second
    return db.execute(
        f"select i.id, i.kind, i.gpu_id, i.opened_at, i.last_seen, g.health, "
        f"{health_backed_sql('i.')} from incidents "
        f"i indexed by idx_incidents_state left join gpus g on g.id = i.gpu_id where "
        f"{sql_active('i.state')} and "
        f"i.cause_id is null and i.kind in ('xid', 'gpu_lost', 'gpu_reset') and "
        f"coalesce(i.settle_until, 0) < ?", [now]).fetchall()


@dataclass(frozen=True)
class SettledCause:
    """An active cause incident (Xid, lost, reset) settled before the check, with what its
    resolution is decided on: its GPU's health now and whether it rests on it (``backed``);
    for a health-backed one on a GPU, the latest transition since it opened that made the
    GPU usable again (``clearing``: ts, how, cause); for any other, its stalls (``stalls``:
    how many are active, the latest end) and its GPU's latest move back to ``ok`` from one
    of ``back_from`` since it opened (``back``: ts, previous, cause)."""

    id: int
    kind: str
    gpu_id: str | None
    opened_at: int
    last_seen: int
    health: str | None
    backed: bool
    clearing: tuple[int, str, str] | None = None
    stalls: tuple[int, int | None] = (0, None)
    back: tuple | None = None


def settled_facts(db: Database, now: int, ok: str, back_from: Sequence[str]
                  ) -> list[SettledCause]:
    """The cause incidents settled before ``now`` (:func:`settled_causes`), each with the
    reads its resolution is decided on (:class:`SettledCause`)."""
    found = []
    for incident_id, kind, gpu_id, opened_at, last_seen, health, backed in \
            settled_causes(db, now):
        if backed and gpu_id:
            found.append(SettledCause(incident_id, kind, gpu_id, opened_at, last_seen,
                                      health, True, last_clearing(db, gpu_id, opened_at)))
            continue
        active, ended = stalls_caused(db, incident_id)
        back = back_to(db, gpu_id, ok, opened_at, back_from) if gpu_id else None
        found.append(SettledCause(incident_id, kind, gpu_id, opened_at, last_seen, health,
                                  bool(backed), stalls=(active, ended),
                                  back=tuple(back) if back else None))
    return found


def stalls_caused(db: Database, incident_id: int) -> tuple[int, int | None]:
    """(how many are active, the latest end) of the stalls that are effects of the incident."""
    return db.execute(f"select count(*) filter (where {sql_active()}), "
                      f"max(closed_at) from incidents where cause_id = ? and "
                      f"kind = 'process_stall'", [incident_id]).fetchone()


def back_to(db: Database, gpu_id: str, state: str, since: int,
            previous: Sequence[str]) -> tuple | None:
    """(ts, previous, cause) of the GPU's latest health move to ``state`` from one of
    ``previous`` at or after ``since``."""
    return db.execute(
        f"select ts, previous, cause from gpu_health_history where gpu_id = ? and "
        f"state = ? and ts >= ? and previous in ({', '.join('?' * len(previous))})"
        f" order by ts desc limit 1", [gpu_id, state, since, *previous]).fetchone()


# --- rule findings -----------------------------------------------------------------------------
def active_by_key(db: Database, dedup_key: str) -> tuple | None:
    """(id, severity) of the active incident of ``dedup_key``."""
    return db.execute(f"select id, severity from incidents where dedup_key = ? and "
                      f"{sql_active()}", [dedup_key]).fetchone()


def seen_at(db: Database, incident_id: int, ts: int) -> None:
    """The incident was seen (again) at ``ts``: an ongoing stall, a cleared finding."""
    db.execute("update incidents set last_seen = max(last_seen, ?) where id = ?",
               [ts, incident_id])


def finding_again(db: Database, incident_id: int, severity: str, ts: int,
                  settle_until: int) -> None:
    """A firing finding seen again: its (worst) severity, last seen, settling."""
    db.execute("update incidents set severity = ?, last_seen = max(last_seen, ?), "
               "settle_until = ? where id = ?", [severity, ts, settle_until, incident_id])


def active_findings(db: Database, gpu_id: str | None, rule_kind: str) -> list[tuple]:
    """(id, pid, start_time, rule_id, explains, dedup_key, details, title, severity,
    opened_at) of the GPU's active rule-finding causes of ``rule_kind``, oldest first."""
    return db.execute(
        f"select id, pid, start_time, json_extract(details, '$.rule_id'), "
        f"json_extract(details, '$.explains'), dedup_key, details, title, severity, "
        f"opened_at from incidents where kind = 'rule_finding' and cause_id is null and "
        f"gpu_id = ? and {sql_active()} and json_extract(details, '$.rule_kind') = ? "
        f"order by opened_at, id", [gpu_id, rule_kind]).fetchall()


@dataclass(frozen=True)
class FindingFacts:
    """What a rule finding's incident is decided on: the active incident of its dedup key
    (``active``: id, severity); for a firing finding that has none, its GPU's active cause
    incidents opened by the finding's start (``causes``: rows of :func:`active_causes`) and
    its GPU's active rule-finding incidents of the kinds asked for (``held``: rows of
    :func:`active_findings` by kind)."""

    active: tuple | None = None
    causes: tuple[tuple, ...] = ()
    held: dict[str, tuple[tuple, ...]] = field(default_factory=dict)


def finding_facts(db: Database, dedup_key: str, firing: bool, gpu_id: str,
                  since: int, cause_kinds: Sequence[str],
                  held_kinds: Sequence[str]) -> FindingFacts:
    """The rows a rule finding's incident is decided on (:class:`FindingFacts`): only the
    active incident of ``dedup_key`` for a cleared finding or one that has it; else also
    ``gpu_id``'s active causes of ``cause_kinds`` (none without a GPU) and its active
    findings of each of ``held_kinds`` (``gpu_id`` as the finding names it: '' for none)."""
    active = active_by_key(db, dedup_key)
    if not firing or active:
        return FindingFacts(tuple(active) if active else None)
    causes = tuple(tuple(r) for r in active_causes(db, gpu_id, cause_kinds, since)) \
        if gpu_id else ()
    return FindingFacts(None, causes, {kind: tuple(tuple(r) for r in
                                                   active_findings(db, gpu_id, kind))
                                       for kind in held_kinds})


def answer_symptom(db: Database, incident_id: int, symptom_key: str,
                   answer: Mapping[str, Any], others: Sequence[int]) -> None:
    """The symptom incident ``incident_id`` takes ``answer`` (dedup_key, title, summary,
    details, severity, process: (pid, start_time) or None to keep the symptom's, opened_at,
    seen, settle_until), its cause: the
    symptom is kept as a link of it (a row of its own under ``symptom_key``), and so are
    ``others``."""
    moved = dict(db.execute_returning_dicts("select * from incidents where id = ?",
                                            [incident_id])[0])
    moved.pop("id")
    db.table("incidents").insert({**moved, "cause_id": incident_id, "dedup_key": symptom_key})
    db.execute("update incidents set dedup_key = ?, title = ?, summary = ?, details = ?, "
               "severity = ?, pid = ?, start_time = ?, opened_at = min(opened_at, ?), "
               "last_seen = max(last_seen, ?), updated_at = ?, settle_until = ? "
               "where id = ?",
               [answer["dedup_key"], answer["title"], answer["summary"],
                json.dumps(answer["details"], sort_keys=True), answer["severity"],
                *(answer["process"] or (moved["pid"], moved["start_time"])),
                answer["opened_at"], answer["seen"], answer["seen"], answer["settle_until"],
                incident_id])
    for other in others:
        db.execute("update incidents set cause_id = ? where id = ?", [incident_id, other])


def mark_alerted(db: Database, incident_ids: Sequence[int], ts: int) -> None:
    """Note that the incidents' alerts were sent at ``ts``, in a transaction of its own
    (after the batch's commit: the journal has them then)."""
    with db.atomic():
        db.execute(f"update incidents set alerted_at = ? where id in "
                   f"({', '.join('?' * len(incident_ids))})", [ts, *incident_ids])
