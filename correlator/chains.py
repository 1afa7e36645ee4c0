"""Root-cause chains: ordered, typed links from a cause to its effects, each with evidence.

``cron_job`` / ``timer`` / ``operator_command`` -> ``command`` -> ``driver_call`` ->
``gpu_reset`` / ``xid`` / ``gpu_lost`` -> ``process_stall`` / ``process_exit``; also an Xid
naming a pid -> that process, Xid 45 -> the earlier Xid it follows, repeated Xids after a
reset -> ``escalation`` (hardware inspection); on a GPU the kernel says fell off the bus, a
GPU source that still reads it -> ``contradicting`` (evidence against, not a recovery).
Built from the store only, so rebuilding a settling incident after a late event puts the
event where it belongs: this module decides the links from the rows that
:mod:`gpuwhy.store.incident_chains` reads, and that module writes them back.

Steps are in time order, each dated by its own evidence; the kind's place in the story
orders only steps of the same time. (They were ordered by kind first: a rule finding on a
lost GPU came before the process the Xid line named, dated earlier; and a reset's driver
call, stamped when the call returned, came after the GPU source saw the reset begin. A
driver call's step is dated when the call was made, its return less its latency.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.model import SYMPTOM
from gpuwhy.store import gpu_bindings, gpu_identity, incident_chains

if TYPE_CHECKING:
    from gpuwhy.correlator.incidents import IncidentBuilder

CAUSE_LOOKBACK_NS = 30 * NS_PER_SECOND
ESCALATE_AFTER = 2          # Xids on a GPU after a reset that call for a hardware inspection
MAX_NAMED = 8               # processes an Xid incident names (a storm names its first few)


@dataclass
class Link:
    """One step of a chain. ``evidence``: the stored rows it rests on (table and keys)."""

    kind: str
    ts: int
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    confidence: float = 1.0
    pid: int | None = None
    start_time: int | None = None
    gpu_id: str | None = None


def rebuild(db: Database, incident_id: int, builder: IncidentBuilder) -> list[Link]:
    """Build the chain of one incident from the store and store it (links, processes)."""
    incident = incident_chains.incident(db, incident_id)
    kind = incident["kind"]
    if kind == "gpu_reset":
        links = _reset_chain(db, incident, builder)
    elif kind in ("xid", "gpu_lost"):
        links = _xid_chain(db, incident, builder)
    elif kind in ("process_stall", "process_exit"):
        links = _effect_chain(db, incident)
    elif kind == "rule_finding":
        links = _finding_chain(db, incident) + _effect_links(db, incident, builder, only=set())
    else:
        links = [_self_link(incident)]
    links.sort(key=lambda link: (link.ts, _ORDER.get(link.kind, 5)))
    incident_chains.store_chain(db, incident_id, [asdict(link) for link in links])
    return links


_ORDER = {"cron_job": 0, "timer": 0, "operator_command": 0, "command": 1, "driver_call": 2,
          "earlier_xid": 2, "gpu_reset": 3, "xid": 3, "gpu_lost": 3, "rule_finding": 3,
          "process": 4, "escalation": 4, "later_xid": 4, "contradicting": 4, "symptom": 5,
          "process_stall": 5, "process_exit": 6}


def _self_link(incident: dict) -> Link:
    details = json.loads(incident["details"] or "{}")
    return Link(incident["kind"], incident["opened_at"], incident["title"],
                {"incident": incident["id"], **details}, 1.0, incident["pid"],
                incident["start_time"], incident["gpu_id"])


def _comm(db: Database, key: ProcessKey) -> str:
    return incident_chains.process_name(db, key)


# --- causes --------------------------------------------------------------------------------
def _reset_call(db: Database, incident: dict) -> tuple | None:
    gpu_id, at = incident["gpu_id"], incident["opened_at"]
    rows = incident_chains.reset_calls(db, at - CAUSE_LOOKBACK_NS, incident["last_seen"])
    for row in rows:
        key = ProcessKey(row[2], row[3])
        if gpu_id is None or gpu_id in gpu_bindings.gpus_of(db, key, row[1]) or \
                row[4].endswith(tuple(f"nvidia{m}" for m in gpu_identity.minors_of(db, gpu_id))):
            return row
    return None


def _origin_links(db: Database, key: ProcessKey, at: int) -> list[Link]:
    """What ran ``key``: its exec (command) and the cron job, timer or operator behind it."""
    links = []
    ancestry = gpu_bindings.ancestry(db, key)
    execs = incident_chains.last_exec(db, key, at)
    if execs:
        filename = json.loads(execs[2]).get("filename", "?")
        links.append(Link("command", execs[1], f"pid {key.pid} ran {filename}",
                          {"events": [execs[0]], "filename": filename}, 1.0, key.pid,
                          key.start_time))
    for depth, process in enumerate(ancestry):
        run = incident_chains.cron_run_of(db, process, at - 3600 * NS_PER_SECOND, at)
        if run:
            exact = run[6] is not None
            links.insert(0, Link(
                "cron_job", run[1], f"cron ran `{run[3]}` as {run[2]} (job pid {run[5]})"
                + (f": {run[4]}" if run[4] else ""),
                {"cron_runs": [run[0]], "gpu_action": run[4], "ancestry_depth": depth},
                0.95 if exact else 0.7, run[5], run[6]))
            return links
    cgroup = incident_chains.cgroup_and_uid(db, key)
    # who ran it did so by the exec at the latest: dated there, it comes first in time too
    origin = links[0].ts if links else at
    if cgroup and cgroup[0] and ".timer" not in cgroup[0] and cgroup[0].endswith(".service"):
        links.insert(0, Link("timer", origin, f"systemd unit {cgroup[0].rsplit('/', 1)[-1]}",
                             {"processes": [str(key)], "cgroup": cgroup[0]}, 0.6, key.pid,
                             key.start_time))
    elif cgroup is not None:
        links.insert(0, Link("operator_command", origin,
                             f"run by uid {cgroup[1]} (no cron job or timer found)",
                             {"processes": [str(p) for p in ancestry]}, 0.5, key.pid,
                             key.start_time))
    return links


def _reset_chain(db: Database, incident: dict, builder: IncidentBuilder) -> list[Link]:
    links = []
    call = _reset_call(db, incident)
    actor = None
    if call:
        actor = ProcessKey(call[2], call[3])
        made = call[1] - max(0, call[8] or 0)     # made then; stamped when it returned
        links += _origin_links(db, actor, made)
        links.append(Link("driver_call", made,
                          f"pid {actor.pid} ({_comm(db, actor)}) sent {call[5]} on {call[4]} "
                          f"({call[7]})", {"driver_calls": [call[0]]}, 0.9, actor.pid,
                          actor.start_time, incident["gpu_id"]))
    link = _self_link(incident)
    link.summary = f"GPU {incident['gpu_id'] or '?'} reset"
    links.append(link)
    links += _effect_links(db, incident, builder, exclude={actor} if actor else set())
    return links


def _xid_chain(db: Database, incident: dict, builder: IncidentBuilder) -> list[Link]:
    details = json.loads(incident["details"] or "{}")
    gpu_id, at = incident["gpu_id"], incident["opened_at"]
    links = []
    if details.get("xid") == 45:
        earlier = incident_chains.earlier_xid(db, gpu_id, incident["id"],
                                              at - CAUSE_LOOKBACK_NS, at)
        if earlier:
            links.append(Link("earlier_xid", earlier[1], f"follows {earlier[2]} (Xid 45 is the "
                              "channel teardown caused by a previous Xid)",
                              {"incident": earlier[0]}, 0.8, gpu_id=gpu_id))
    link = _self_link(incident)
    if incident["count"] and incident["count"] > 1:
        link.summary += f" (×{incident['count']})"
    links.append(link)
    known = None
    if incident["pid"] is not None:
        known = ProcessKey(incident["pid"], incident["start_time"])
        links.append(Link("process", at, f"the Xid line names pid {known.pid} "
                          f"({details.get('name') or _comm(db, known)})",
                          {"kernel_log_pid": details.get("pid")}, 0.95, known.pid,
                          known.start_time, gpu_id))
    # The driver names the faulting process even where gpuwhy never saw it (no probes, or a
    # process gone in a second): that pid, not whichever process was last on the GPU.
    # (the first MAX_NAMED of a storm; the Xid's own step says how many lines there were)
    # Where gpuwhy saw it (the probes), the named process is linked by its key.
    seen = {known} if known is not None else set()
    for pid, name, *start in details.get("named") or []:
        start_time = start[0] if start else None
        if known is None or pid != known.pid:
            links.append(Link("process", at, f"the Xid line names pid {pid} ({name or '?'})",
                              {"kernel_log_pid": pid}, 0.95, pid, start_time, gpu_id))
            if start_time is not None:
                seen.add(ProcessKey(pid, start_time))
    resets = incident_chains.last_reset_before(db, gpu_id, at)
    if resets is not None:
        after = incident_chains.xids_between(db, gpu_id, resets, at)
        if after[0] >= ESCALATE_AFTER:
            links.append(Link("escalation", at, f"{after[0]} Xids on this GPU since its last "
                              "reset: take it out of service for a hardware inspection",
                              {"incidents": [int(i) for i in after[1].split(",")]}, 0.7,
                              gpu_id=gpu_id))
    contradicted = details.get("contradicted")
    if isinstance(contradicted, dict) and contradicted.get("ts") is not None:
        links.append(Link(
            "contradicting", int(contradicted["ts"]),
            f"GPU source {contradicted.get('source') or '?'} still reads the GPU "
            f"({contradicted.get('event') or 'a sample'}) while it is lost "
            f"({contradicted.get('state_cause') or '?'}): evidence against it, not a "
            f"recovery; it clears only at a "
            f"{' or a '.join(contradicted.get('clears_by') or ['reboot'])}, or an "
            f"operator's mark-healthy",
            {"contradicted": contradicted}, 1.0, gpu_id=gpu_id))
    named = seen if seen or details.get("named") else None
    links += _effect_links(db, incident, builder, only=named)
    return links


# --- effects -------------------------------------------------------------------------------
def _effect_links(db: Database, incident: dict, builder: IncidentBuilder,
                  exclude: frozenset[ProcessKey] | set[ProcessKey] = frozenset(),
                  only: set | None = None) -> list[Link]:
    """The incident's effects (rows naming it as their cause: stalls, deaths, rule findings,
    later Xids), then the other processes on the GPU at the time (unless ``only`` names the
    processes it is about)."""
    gpu_id, at = incident["gpu_id"], incident["opened_at"]
    links = []
    affected: set[ProcessKey] = set()
    effects = incident_chains.effects_of(db, incident["id"])
    for effect_id, kind, ts, title, summary, pid, start_time, details in effects:
        key = ProcessKey(pid, start_time) if pid is not None else None
        if key in exclude:
            continue
        if kind == "xid":
            links.append(Link("later_xid", ts, f"then {title}", {"incident": effect_id}, 0.8,
                              gpu_id=gpu_id))
        elif kind == "rule_finding":     # a symptom the cause explains, or another finding
            finding = json.loads(details or "{}")
            symptom = finding.get("rule_kind") == SYMPTOM and incident["kind"] == "rule_finding"
            links.append(Link("symptom" if symptom else "rule_finding", ts,
                              f"rule {finding.get('rule_id', '?')}: {title}",
                              {"incident": effect_id, **finding}, 0.7, pid, start_time,
                              gpu_id))
        else:       # a stall's or death's summary names the pid: name the process too
            if key is not None:
                summary = summary.replace(f"pid {pid} ", f"pid {pid} ({_comm(db, key)}) ", 1)
            links.append(Link(kind, ts, summary, {"incident": effect_id}, 0.8, pid,
                              start_time, gpu_id))
        if key is not None:
            affected.add(key)
    if gpu_id is None or only is not None:
        return links
    for binding in gpu_bindings.bound_at(db, gpu_id, at):
        key = binding.process
        if key not in affected and key not in exclude:
            links.append(Link("process", at, f"pid {key.pid} ({_comm(db, key)}) was bound to "
                              f"the GPU", {"gpu_bindings": [str(key)]}, 0.6, key.pid,
                              key.start_time, gpu_id))
    return links


def _effect_chain(db: Database, incident: dict) -> list[Link]:
    """A stall or death: the cause incident it is an effect of (if any), then itself."""
    links = []
    if incident.get("cause_id") is not None:
        cause = incident_chains.cause_row(db, incident["cause_id"])
        if cause:
            links.append(Link(cause[1], cause[2], cause[3], {"incident": cause[0]}, 0.8,
                              gpu_id=incident["gpu_id"]))
    links.append(_self_link(incident))
    return links


def _finding_chain(db: Database, incident: dict) -> list[Link]:
    """A rule finding: itself, then every process it names (a contention finding names all
    the processes sharing the GPU); the symptoms it explains follow as its effects."""
    links = [_self_link(incident)]
    details = json.loads(incident["details"] or "{}")
    for named in details.get("processes") or []:
        try:
            key = ProcessKey(int(named["pid"]), int(named["start_time"]))
        except (KeyError, TypeError, ValueError):
            continue
        links.append(Link("process", incident["opened_at"],
                          f"pid {key.pid} ({_comm(db, key)})", {"processes": [str(key)]},
                          1.0, key.pid, key.start_time, incident["gpu_id"]))
    return links
