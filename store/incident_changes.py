"""Incident lifecycle writes: acknowledge, resolve, reopen, note; each one a log row.

The correlator (its automatic resolutions and reopenings), the CLI and the web view (an
operator's acknowledgement, resolution or note) all change an incident through here, so an
incident's ``state``, ``resolution`` and ``incident_log`` always agree, and each change can be
written to the journal with the incident's fields (:func:`journal_entry`). States and
resolutions are :mod:`gpuwhy.lifecycle`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, overload

from sqlite_utils import Database

from gpuwhy import lifecycle as lc
from gpuwhy import severity as sev
from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.journal import (
    CHANGE_MESSAGE_IDS,
    MESSAGE_IDS,
    SYSLOG_IDENTIFIER,
    Sender,
    one_line,
    write_entry,
)
from gpuwhy.rules.answer import sentence
from gpuwhy.rules.model import Rule
from gpuwhy.store import health
from gpuwhy.store.incident_log import log_change, mark_resolved
from gpuwhy.store.queries import gpu_verdict, pci_and_uuid

ANSWER_MAX = 1000       # the answer's sentence in an alert: one bounded line


class IncidentNotFound(GpuwhyError):
    """No incident has this id."""

    def __init__(self, incident_id: int):
        self.incident_id = incident_id
        super().__init__(f"no incident {incident_id} (see `gpuwhy incidents`)")


class LifecycleError(GpuwhyError):
    """A change the incident's state does not allow (acknowledging a resolved incident), or
    a note or name that is empty, too long or not text."""


def _state(db: Database, incident_id: int) -> tuple[str, int | None]:
    row = db.execute("select state, closed_at from incidents where id = ?",
                     [incident_id]).fetchone()
    if row is None:
        raise IncidentNotFound(incident_id)
    return row[0], row[1]


@overload
def _text(value: str | None, what: str, limit: int, required: Literal[True]) -> str: ...
@overload
def _text(value: str | None, what: str, limit: int, required: bool = False) -> str | None: ...
def _text(value: str | None, what: str, limit: int, required: bool = False) -> str | None:
    if value is None or not value.strip():
        if required:
            raise LifecycleError(f"a {what} needs some text")
        return None
    value = value.strip()
    if len(value) > limit:
        raise LifecycleError(f"the {what} is {len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise LifecycleError(f"the {what} holds a NUL character")
    return value


def _operator_input(ts: int | None, actor: str, text: str | None
                    ) -> tuple[int, str, str | None]:
    """The time (now if none), the checked name and the checked optional note of a change."""
    name = _text(actor, "name", lc.ACTOR_MAX, required=True)
    return (now_ns() if ts is None else ts), name, _text(text, "note", lc.NOTE_MAX)


def acknowledge(db: Database, incident_id: int, actor: str, text: str | None = None,
                ts: int | None = None) -> int:
    """An operator has the incident: ``open`` -> ``acknowledged``. Returns the log row id.
    Acknowledging an acknowledged incident only adds its text as a note."""
    ts, actor, text = _operator_input(ts, actor, text)
    with db.atomic():
        state, _ = _state(db, incident_id)
        if state == lc.RESOLVED:
            raise LifecycleError(f"incident {incident_id} is resolved: nothing to acknowledge")
        if state == lc.ACKNOWLEDGED:
            if text is None:
                raise LifecycleError(f"incident {incident_id} is acknowledged already")
            return log_change(db, incident_id, lc.NOTE, ts, actor, text=text)
        db.execute("update incidents set state = ?, acknowledged_at = ?, acknowledged_by = ?, "
                   "updated_at = ? where id = ?",
                   [lc.ACKNOWLEDGED, ts, actor, ts, incident_id])
        return log_change(db, incident_id, lc.ACKNOWLEDGE, ts, actor, text=text)


def resolve(db: Database, incident_id: int, actor: str, how: str = lc.OPERATOR,
            text: str | None = None, ts: int | None = None) -> int:
    """``open``/``acknowledged`` -> ``resolved``, saying how; returns the log row id."""
    if how not in lc.RESOLUTIONS:
        raise LifecycleError(f"{how!r} is not a way to resolve: {', '.join(lc.RESOLUTIONS)}")
    ts, actor, text = _operator_input(ts, actor, text)
    with db.atomic():
        state, _ = _state(db, incident_id)
        if state == lc.RESOLVED:
            raise LifecycleError(f"incident {incident_id} is resolved already")
        mark_resolved(db, incident_id, how, ts)
        log_id = log_change(db, incident_id, lc.RESOLVE, ts, actor, resolution=how, text=text)
        if how == lc.OPERATOR:
            # an incident resting on its GPU's health takes the GPU's health with it
            health.operator_resolved(db, incident_id, actor, text, ts)
        return log_id


def note(db: Database, incident_id: int, actor: str, text: str,
         ts: int | None = None) -> int:
    """A note on the incident, in any state; returns the log row id."""
    ts = now_ns() if ts is None else ts
    actor = _text(actor, "name", lc.ACTOR_MAX, required=True)
    body = _text(text, "note", lc.NOTE_MAX, required=True)
    with db.atomic():
        _state(db, incident_id)
        db.execute("update incidents set updated_at = ? where id = ?", [ts, incident_id])
        return log_change(db, incident_id, lc.NOTE, ts, actor, text=body)


def apply_change(db: Database, incident_id: int, change: str, actor: str,
                 text: str | None = None) -> dict[str, object]:
    """An operator's change by its word (``ack``, ``resolve``, ``note``), for the CLI and
    the web view alike: ``{id, action, state, resolution, log_id}`` after it."""
    if change == "ack":
        log_id = acknowledge(db, incident_id, actor, text)
    elif change == "resolve":
        log_id = resolve(db, incident_id, actor, text=text)
    elif change == "note":
        log_id = note(db, incident_id, actor, text or "")
    else:
        raise LifecycleError(f"{change!r} is not a change: {', '.join(lc.OPERATOR_CHANGES)}")
    action = db.execute("select action from incident_log where id = ?", [log_id]).fetchone()[0]
    state, resolution = db.execute("select state, resolution from incidents where id = ?",
                                   [incident_id]).fetchone()
    return {"id": incident_id, "action": action, "state": state, "resolution": resolution,
            "log_id": log_id}


def resolve_decided(db: Database, incident_id: int, how: str, ts: int, why: str,
                    actor: str) -> int | None:
    """Apply a decided resolution: the active incident and its active effects (they end
    with their cause) are resolved at ``ts``, ``how``, each with its log row. Returns the
    incident's log row id if it is a cause (its change is news for the journal; an effect's
    is not)."""
    mark_resolved(db, incident_id, how, ts)
    change = log_change(db, incident_id, lc.RESOLVE, ts, actor, how, why)
    row = db.execute("select cause_id from incidents where id = ?", [incident_id]).fetchone()
    effects = [r[0] for r in db.execute(f"select id from incidents where cause_id = ? and "
                                        f"{lc.sql_active()}", [incident_id]).fetchall()]
    for effect in effects:
        mark_resolved(db, effect, how, ts)
        log_change(db, effect, lc.RESOLVE, ts, actor, how,
                   f"its cause, incident {incident_id}, was resolved")
    return change if row and row[0] is None else None


def mark_reopened(db: Database, incident_id: int, ts: int) -> None:
    """A resolved incident is active again (a repeat within the reopen window)."""
    db.execute("update incidents set state = ?, resolution = null, closed_at = null, "
               "acknowledged_at = null, acknowledged_by = null, updated_at = ? where id = ?",
               [lc.OPEN, ts, incident_id])


def incident_fields(db: Database, incident_id: int, base_url: str) -> dict[str, str]:
    """The journal fields that name an incident (alerts and changes alike)."""
    [incident] = db.execute_returning_dicts(
        "select i.id, i.kind, i.severity, i.state, i.resolution, i.gpu_id, i.pid, "
        "i.start_time, i.title, i.summary, i.opened_at, g.health from incidents i "
        "left join gpus g on g.id = i.gpu_id where i.id = ?", [incident_id])
    pci, uuid = pci_and_uuid(db, incident["gpu_id"])
    fields = {
        "PRIORITY": str(sev.journal_priority(incident["severity"])),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "GPUWHY_INCIDENT_ID": str(incident_id),
        "GPUWHY_KIND": incident["kind"],
        "GPUWHY_SEVERITY": incident["severity"],
        "GPUWHY_STATE": incident["state"],
        "GPUWHY_URL": f"{base_url.rstrip('/')}/incidents/{incident_id}",
    }
    optional = {"GPU_ID": incident["gpu_id"], "GPU_UUID": uuid, "GPU_PCI": pci,
                "GPU_HEALTH": incident["health"] if incident["gpu_id"] else None,
                "GPUWHY_RESOLUTION": incident["resolution"],
                "PID": incident["pid"], "GPUWHY_PROCESS_START_TIME": incident["start_time"]}
    fields.update({k: str(v) for k, v in optional.items() if v is not None})
    return fields


def answer_fields(db: Database, gpu_id: str | None, rules: Mapping[str, Rule] | None
                  ) -> dict[str, str]:
    """The answer on the incident's GPU as it stands (gpuwhy why's sentence, what leads it),
    for an alert: empty without rules, a GPU, or while the GPU is healthy."""
    verdict = gpu_verdict(db, rules, gpu_id) if rules else None
    if verdict is None or verdict.healthy:
        return {}
    lead = verdict.lead
    return {"GPUWHY_ANSWER": one_line(sentence(verdict, utc=True), ANSWER_MAX),
            "GPUWHY_ANSWER_RULE": lead.rule_id if lead is not None
            else f"health:{verdict.gpu.health}"}


def alert_entry(db: Database, incident_id: int, base_url: str,
                rules: Mapping[str, Rule] | None = None) -> dict[str, str]:
    """The journal entry of a new incident: MESSAGE plus its structured fields, with the
    answer on its GPU when ``rules`` are given (:func:`answer_fields`)."""
    fields = incident_fields(db, incident_id, base_url)
    gpu_id = db.execute("select gpu_id from incidents where id = ?", [incident_id]).fetchone()
    fields.update(answer_fields(db, gpu_id[0] if gpu_id else None, rules))
    title, summary = db.execute("select title, summary from incidents where id = ?",
                                [incident_id]).fetchone()
    # title/summary may carry process names from the kernel log: keep them one bounded line
    return {"MESSAGE": f"gpuwhy incident {incident_id}: {one_line(f'{title}: {summary}')}",
            "MESSAGE_ID": MESSAGE_IDS.get(fields["GPUWHY_KIND"], MESSAGE_IDS["rule_finding"]),
            **fields}


def change_entry(db: Database, change_id: int, base_url: str) -> dict[str, str]:
    """The journal entry of one lifecycle change (a row of ``incident_log``)."""
    [change] = db.execute_returning_dicts(
        "select incident_id, ts, action, actor, resolution, text from incident_log "
        "where id = ?", [change_id])
    incident_id = change["incident_id"]
    fields = incident_fields(db, incident_id, base_url)
    what = {lc.ACKNOWLEDGE: "acknowledged", lc.RESOLVE: f"resolved ({change['resolution']})",
            lc.REOPENED: "reopened", lc.NOTE: "noted"}.get(change["action"], change["action"])
    message = f"gpuwhy incident {incident_id} {what} by {change['actor']}"
    if change["text"]:
        message += f": {change['text']}"
    fields.update({
        "MESSAGE": one_line(message),
        "MESSAGE_ID": CHANGE_MESSAGE_IDS.get(change["action"], CHANGE_MESSAGE_IDS[lc.NOTE]),
        "PRIORITY": "5",         # notice: a change of something already alerted on
        "GPUWHY_CHANGE": change["action"],
        "GPUWHY_ACTOR": one_line(change["actor"], lc.ACTOR_MAX),
    })
    if change["text"]:
        fields["GPUWHY_NOTE"] = one_line(change["text"], lc.NOTE_MAX)
    return fields


def send_change(db: Database, change_id: int, base_url: str,
                send: Sender | None = None) -> str | None:
    """Write the journal entry of one lifecycle change; None when written, else why not
    (the change is stored either way)."""
    return write_entry(change_entry(db, change_id, base_url), send)
