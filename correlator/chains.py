"""Root-cause chains: ordered, typed links from a cause to its effects, each with evidence.

``cron_job`` / ``timer`` / ``operator_command`` -> ``command`` -> ``driver_call`` ->
``gpu_reset`` / ``xid`` / ``gpu_lost`` -> ``process_stall`` / ``process_exit``; also an Xid
naming a pid -> that process, Xid 45 -> the earlier Xid it follows, repeated Xids after a
reset -> ``escalation`` (hardware inspection); on a GPU the kernel says fell off the bus, a
GPU source that still reads it -> ``contradicting`` (evidence against, not a recovery).
Built from the store only, so rebuilding a settling incident after a late event puts the
event where it belongs. A decision is a value: :func:`gpuwhy.store.incident_chains.chain_facts`
reads every fact a chain needs in one call, :func:`decide` turns those facts into links with
no database at hand (a chain can be decided, and tested, from hand-written facts), and
:func:`gpuwhy.store.incident_chains.store_chain` writes the links back.

Steps are in time order, each dated by its own evidence; the kind's place in the story
orders only steps of the same time. (They were ordered by kind first: a rule finding on a
lost GPU came before the process the Xid line named, dated earlier; and a reset's driver
call, stamped when the call returned, came after the GPU source saw the reset begin. A
driver call's step is dated when the call was made, its return less its latency.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey
from gpuwhy.rules.model import SYMPTOM
from gpuwhy.store import incident_chains
from gpuwhy.store.incident_chains import ChainFacts, Effect, Origin, ResetCall

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


def rebuild(db: Database, incident_id: int) -> list[Link]:
    """Build the chain of one incident from the store and store it (links, processes):
    read its facts, decide, write the links back."""
    links = decide(incident_chains.chain_facts(db, incident_id))
    incident_chains.store_chain(db, incident_id, [asdict(link) for link in links])
    return links


def decide(facts: ChainFacts) -> list[Link]:
    """The chain's links, in time order, from the facts alone."""
    kind = facts.incident["kind"]
    if kind == "gpu_reset":
        links = _reset_chain(facts)
    elif kind in ("xid", "gpu_lost"):
        links = _xid_chain(facts)
    elif kind in ("process_stall", "process_exit"):
        links = _effect_chain(facts)
    elif kind == "rule_finding":
        links = _finding_chain(facts) + _effect_links(facts, only=set())
    else:
        links = [_self_link(facts.incident)]
    links.sort(key=lambda link: (link.ts, _ORDER.get(link.kind, 5)))
    return links


_ORDER = {"cron_job": 0, "timer": 0, "operator_command": 0, "command": 1, "driver_call": 2,
          "earlier_xid": 2, "gpu_reset": 3, "xid": 3, "gpu_lost": 3, "rule_finding": 3,
          "process": 4, "escalation": 4, "later_xid": 4, "contradicting": 4, "symptom": 5,
          "process_stall": 5, "process_exit": 6}


def _self_link(incident: Mapping[str, Any]) -> Link:
    details = json.loads(incident["details"] or "{}")
    return Link(incident["kind"], incident["opened_at"], incident["title"],
                {"incident": incident["id"], **details}, 1.0, incident["pid"],
                incident["start_time"], incident["gpu_id"])


# --- causes --------------------------------------------------------------------------------
def _reset_call(facts: ChainFacts) -> ResetCall | None:
    """The first reset call around the reset that reached its GPU: its process held the
    GPU, or the call went to the GPU's device file."""
    gpu_id = facts.incident["gpu_id"]
    for call in facts.reset_calls:
        if gpu_id is None or gpu_id in call.gpus or \
                call.path.endswith(tuple(f"nvidia{m}" for m in facts.minors)):
            return call
    return None


def _origin_links(key: ProcessKey, origin: Origin, at: int) -> list[Link]:
    """What ran ``key`` (by ``at``): its exec (command) and the cron job, timer or operator
    behind it."""
    links = []
    if origin.exec_event:
        event_id, ts, body = origin.exec_event
        filename = json.loads(body).get("filename", "?")
        links.append(Link("command", ts, f"pid {key.pid} ran {filename}",
                          {"events": [event_id], "filename": filename}, 1.0, key.pid,
                          key.start_time))
    run = origin.cron_run
    if run:
        exact = run[6] is not None
        links.insert(0, Link(
            "cron_job", run[1], f"cron ran `{run[3]}` as {run[2]} (job pid {run[5]})"
            + (f": {run[4]}" if run[4] else ""),
            {"cron_runs": [run[0]], "gpu_action": run[4], "ancestry_depth": origin.cron_depth},
            0.95 if exact else 0.7, run[5], run[6]))
        return links
    cgroup = origin.cgroup
    # who ran it did so by the exec at the latest: dated there, it comes first in time too
    dated = links[0].ts if links else at
    if cgroup and cgroup[0] and ".timer" not in cgroup[0] and cgroup[0].endswith(".service"):
        links.insert(0, Link("timer", dated, f"systemd unit {cgroup[0].rsplit('/', 1)[-1]}",
                             {"processes": [str(key)], "cgroup": cgroup[0]}, 0.6, key.pid,
                             key.start_time))
    elif cgroup is not None:
        links.insert(0, Link("operator_command", dated,
                             f"run by uid {cgroup[1]} (no cron job or timer found)",
                             {"processes": [str(p) for p in origin.ancestry]}, 0.5, key.pid,
                             key.start_time))
    return links


def _reset_chain(facts: ChainFacts) -> list[Link]:
    incident = facts.incident
    links = []
    call = _reset_call(facts)
    actor = None
    if call:
        actor = call.process
        links += _origin_links(actor, facts.origins.get(call.id, Origin()), call.made)
        links.append(Link("driver_call", call.made,
                          f"pid {actor.pid} ({facts.name(actor)}) sent {call.sub_name} on "
                          f"{call.path} ({call.status_name})", {"driver_calls": [call.id]}, 0.9,
                          actor.pid, actor.start_time, incident["gpu_id"]))
    link = _self_link(incident)
    link.summary = f"GPU {incident['gpu_id'] or '?'} reset"
    links.append(link)
    links += _effect_links(facts, exclude={actor} if actor else set())
    return links


def _xid_chain(facts: ChainFacts) -> list[Link]:
    incident, details = facts.incident, facts.details
    gpu_id, at = incident["gpu_id"], incident["opened_at"]
    links = []
    earlier = facts.earlier_xid
    if details.get("xid") == 45 and earlier:
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
                          f"({details.get('name') or facts.name(known)})",
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
    after = facts.xids_since_reset
    if facts.last_reset is not None and after is not None and after[0] >= ESCALATE_AFTER:
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
    links += _effect_links(facts, only=named)
    return links


# --- effects -------------------------------------------------------------------------------
def _effect_links(facts: ChainFacts,
                  exclude: frozenset[ProcessKey] | set[ProcessKey] = frozenset(),
                  only: set | None = None) -> list[Link]:
    """The incident's effects (rows naming it as their cause: stalls, deaths, rule findings,
    later Xids), then the other processes on the GPU at the time (unless ``only`` names the
    processes it is about)."""
    incident = facts.incident
    gpu_id, at = incident["gpu_id"], incident["opened_at"]
    links = []
    affected: set[ProcessKey] = set()
    for effect in facts.effects:
        key = effect.process
        if key in exclude:
            continue
        links.append(_effect_link(facts, effect, key))
        if key is not None:
            affected.add(key)
    if gpu_id is None or only is not None:
        return links
    for key in facts.bound:
        if key not in affected and key not in exclude:
            links.append(Link("process", at, f"pid {key.pid} ({facts.name(key)}) was bound to "
                              f"the GPU", {"gpu_bindings": [str(key)]}, 0.6, key.pid,
                              key.start_time, gpu_id))
    return links


def _effect_link(facts: ChainFacts, effect: Effect, key: ProcessKey | None) -> Link:
    gpu_id = facts.incident["gpu_id"]
    if effect.kind == "xid":
        return Link("later_xid", effect.ts, f"then {effect.title}", {"incident": effect.id},
                    0.8, gpu_id=gpu_id)
    if effect.kind == "rule_finding":     # a symptom the cause explains, or another finding
        finding = json.loads(effect.details or "{}")
        symptom = finding.get("rule_kind") == SYMPTOM and \
            facts.incident["kind"] == "rule_finding"
        return Link("symptom" if symptom else "rule_finding", effect.ts,
                    f"rule {finding.get('rule_id', '?')}: {effect.title}",
                    {"incident": effect.id, **finding}, 0.7, effect.pid, effect.start_time,
                    gpu_id)
    # a stall's or death's summary names the pid: name the process too
    summary = effect.summary
    if key is not None:
        summary = summary.replace(f"pid {effect.pid} ", f"pid {effect.pid} ({facts.name(key)}) ",
                                  1)
    return Link(effect.kind, effect.ts, summary, {"incident": effect.id}, 0.8, effect.pid,
                effect.start_time, gpu_id)


def _effect_chain(facts: ChainFacts) -> list[Link]:
    """A stall or death: the cause incident it is an effect of (if any), then itself."""
    incident = facts.incident
    links = []
    cause = facts.cause
    if incident.get("cause_id") is not None and cause:
        links.append(Link(cause[1], cause[2], cause[3], {"incident": cause[0]}, 0.8,
                          gpu_id=incident["gpu_id"]))
    links.append(_self_link(incident))
    return links


def _finding_chain(facts: ChainFacts) -> list[Link]:
    """A rule finding: itself, then every process it names (a contention finding names all
    the processes sharing the GPU); the symptoms it explains follow as its effects."""
    incident = facts.incident
    links = [_self_link(incident)]
    for key in incident_chains.finding_processes(facts.details):
        links.append(Link("process", incident["opened_at"], f"pid {key.pid} ({facts.name(key)})",
                          {"processes": [str(key)]}, 1.0, key.pid, key.start_time,
                          incident["gpu_id"]))
    return links
