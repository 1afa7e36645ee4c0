"""Evidence and event details as rows people read: each key's value with its unit, times as
instants (written by gpuwhy.text.format_ts, in UTC, for the page's <time> tags), and every
incident, process and GPU named in it as a link to its page at that moment.

The keys are the producers' conventions: the chain links' evidence (correlator/chains.py,
an incident's details: correlator/incidents.py), a rule finding's measured values (the
``as`` names of gpuwhy/rules/builtin/*.rules, units by suffix: ``*_ns`` a duration,
``*_share``/``*_frac`` a fraction, ``*_Bps`` a rate, ``*_mib``, ``*_w``, ``*_c``, ``*_mhz``,
``*_per_s``), and the stored events' bodies (store/writer.py: process keys as
``{pid, start_time}``). A key known to none of them is shown as compact text (lists joined
with ", ", mappings as ``k=v``), never as JSON. Text is returned as plain strings: the
templates escape it (process names and kernel-log lines are the process's or the log's).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from flask import url_for

from gpuwhy.gpufields import FABRIC_HEALTH, FABRIC_STATES
from gpuwhy.identity import ProcessKey, mig_instance_name
from gpuwhy.quantities import (  # noqa: F401 - the evidence rows' words, re-exported
    LABELS,
    RATIO_NAMES,
    WORDS,
    compact,
    duration,
    label,
    number,
    percent,
    quantity,
)
from gpuwhy.text import format_ts


@dataclass(frozen=True)
class Part:
    """One piece of a value: ``text`` after ``lead`` (the separator before it); a link when
    ``href`` is set; an instant (realtime ns) when ``ns`` is set, ``text`` then its UTC
    rendering."""

    text: str
    href: str | None = None
    ns: int | None = None
    lead: str = ""


@dataclass(frozen=True)
class Row:
    """One evidence entry: ``key`` as stored, ``name`` as shown, its value's ``parts``;
    ``lines``: one part a line (fixes); ``rows``: a nested mapping's own rows (a rule
    finding's measured values)."""

    key: str
    name: str
    parts: tuple[Part, ...] = ()
    lines: bool = False
    rows: tuple[Row, ...] = ()

    @property
    def text(self) -> str:
        """The value as plain text (what a test or a terminal reads)."""
        if self.rows:
            return "; ".join(f"{r.name} {r.text}" for r in self.rows)
        return "".join(p.lead + p.text for p in self.parts)


# Link makers: (kind, ident, at) -> URL. The web view's uses url_for; None: no links (a
# report that leaves the server).
Linker = Callable[[str, Any, int | None], str | None]

TIME_KEYS = frozenset({"ts", "since", "until", "started", "ended", "first_ts", "last_ts",
                       "started_at", "opened_at", "closed_at", "exited_at", "cleared_at",
                       "acknowledged_at", "last_seen", "first_seen", "window_start",
                       "window_end", "health_since", "state_since"})
# Internal identifiers and bookkeeping a person has no use for on a page (the JSON has them)
HIDDEN = frozenset({"finding_id", "group", "scope", "xid154_since"})
# NVIDIA's immediate resolution buckets (the Xid catalogue's), in words
RESOLUTIONS = {"RESTART_APP": "restart the application", "RESET_GPU": "reset the GPU",
               "RESTART_BM": "reboot the node", "RESTART_VM": "restart the virtual machine",
               "IGNORE": "none needed", "CONTACT_SUPPORT": "contact NVIDIA support",
               "CHECK_MECHANICALS": "check the board's seating, power and cooling",
               "UPDATE_SWFW": "update the driver and firmware", "UNKNOWN": "not documented"}
RULE_KINDS = {"cause": "a cause (why)", "symptom": "a symptom (what is seen, not why)"}
# Shown first, in this order (what it is, what was measured, what to do); the rest as stored
FIRST = ("title", "xid", "rule_id", "instance", "evidence", "root_cause", "fixes", "verify",
         "unexplained", "explains")
LINE_KEYS = frozenset({"fixes", "unexplained", "actions"})
INCIDENT_KEYS = frozenset({"incident", "cause_incident", "incidents", "cause_id"})
PROCESS_LIST_KEYS = frozenset({"processes", "gpu_bindings", "parent", "child", "process"})
GPU_KEYS = frozenset({"gpu", "gpu_id", "gpu_ids", "gpus"})
# Identifiers and codes: written as they are, without thousands separators.
ID_KEYS = frozenset({"pid", "ppid", "uid", "gid", "fd", "minor", "xid", "exit_code", "signal",
                     "start_time", "ancestry_depth", "code", "cmd", "sub", "nr"})
CODE_NAMES = {"fabric_state": FABRIC_STATES, "fabric_health": FABRIC_HEALTH}
_PROCESS_TEXT = re.compile(r"(\d+)-(\d+)")


def url_linker(kind: str, ident: Any, at: int | None) -> str | None:
    """The web view's link to an incident, a process (``ProcessKey``), its list of events
    (``events``: the page of it holding ``at``) or a GPU at ``at``."""
    if kind == "incident":
        return url_for("incidents.show", incident_id=int(ident))
    if kind == "process":
        return url_for("processes.show", key=str(ident), at=at)
    if kind == "events":
        return url_for("processes.show", key=str(ident), at=at, _anchor="events")
    if kind == "gpu":
        return url_for("gpus.show", gpu_id=str(ident), at=at, range="15m" if at else None)
    return None


def evidence_rows(evidence: Any, *, at: int | None = None, pid: int | None = None,
                  start_time: int | None = None, skip: Iterable[str] = (),
                  link: Linker | None = url_linker) -> list[Row]:
    """``evidence`` (a mapping; anything else is one row of compact text) as display rows.

    ``at``: the moment the links open their pages at (the chain step's time); ``pid`` and
    ``start_time``: the process the evidence is about, whose bare pid (a kernel-log line
    names no start time) is then linked to it; ``skip``: keys the page shows elsewhere;
    ``link``: how links are made (None: none).
    """
    if _empty(evidence):
        return []
    if not isinstance(evidence, Mapping):
        return [Row("", "", (Part(compact(evidence)),))]
    process = ProcessKey(int(pid), int(start_time)) \
        if _is_int(pid) and _is_int(start_time) else None
    return _Rows(evidence, at, process, set(skip), link).build()


def detail_rows(detail: Any, *, at: int | None = None, link: Linker | None = url_linker
                ) -> list[Row]:
    """A stored event's detail: its JSON body's fields as rows when it is one (a lifecycle
    or fd event), else one row of its text (a driver call's status, a kernel-log line)."""
    if isinstance(detail, str) and detail.startswith("{"):
        try:
            decoded = json.loads(detail)
        except ValueError:
            decoded = None
        if isinstance(decoded, Mapping):
            return evidence_rows(decoded, at=at, link=link)
    return [Row("", "", (Part(detail),))] if detail not in (None, "") else []


class _Rows:
    def __init__(self, evidence: Mapping, at: int | None, process: ProcessKey | None,
                 skip: set[str], link: Linker | None) -> None:
        self.evidence, self.at, self.process, self.link = evidence, at, process, link
        self.skip = skip

    def build(self) -> list[Row]:
        ev, rows, used = self.evidence, [], set(self.skip)
        first = [k for k in FIRST if k in ev]
        for key in [*first, *(k for k in ev if k not in first)]:
            value = ev[key]
            if key in used or _empty(value):
                continue
            used.add(key)
            row = self._combined(key, value, used)
            if row is None:
                row = self.row(str(key), value)
            if row is not None:
                rows.append(row)
        return rows

    def _combined(self, key: str, value: Any, used: set[str]) -> Row | None:
        """Rows made of two keys: a pid and its start time, a window's two ends, a MIG
        instance and its profile."""
        ev = self.evidence
        if key in ("pid", "start_time") and _is_int(ev.get("pid")) and \
                _is_int(ev.get("start_time")):
            used.update(("pid", "start_time"))
            return Row("pid", "process", (self._process(ProcessKey(int(ev["pid"]),
                                                                   int(ev["start_time"]))),))
        if key in ("window_start", "window_end") and _is_int(ev.get("window_start")) and \
                _is_int(ev.get("window_end")):
            used.update(("window_start", "window_end"))
            start, end = int(ev["window_start"]), int(ev["window_end"])
            return Row("window_start", "evaluated over", (
                _instant(start), _instant(end, lead=" – "),
                Part(f"({duration(end - start)})", lead=" ")))
        if key in ("instance", "mig_profile"):
            used.update(("instance", "mig_profile"))
            if _empty(ev.get("instance")):
                return None
            return Row("instance", "MIG instance", (Part(mig_instance_name(
                str(ev["instance"]), str(ev.get("mig_profile") or ""))),))
        return None

    def row(self, key: str, value: Any) -> Row | None:
        if key in HIDDEN:
            return None
        name = label(key, value)
        if key == "evidence" and isinstance(value, Mapping):
            nested = _Rows(value, self.at, self.process, set(), self.link).build()
            return Row(key, name, rows=tuple(nested)) if nested else None
        if key in LINE_KEYS and isinstance(value, list):
            return Row(key, name, tuple(Part(compact(v)) for v in value), lines=True)
        return Row(key, name, tuple(self.parts(key, value)))

    def parts(self, key: str, value: Any) -> list[Part]:
        if key in INCIDENT_KEYS:
            ids = value if isinstance(value, list) else [value]
            if all(_is_int(i) for i in ids):
                return _joined(Part(f"incident {int(i)}", self._href("incident", int(i)))
                               for i in ids)
        if key in PROCESS_LIST_KEYS:
            keys = [_process_key(v) for v in (value if isinstance(value, list) else [value])]
            known = [k for k in keys if k is not None]
            if keys and len(known) == len(keys):
                return _joined(self._process(k) for k in known)
        if key in GPU_KEYS:
            ids = value if isinstance(value, list) else [value]
            if all(isinstance(i, str) and i for i in ids):
                return _joined(Part(f"GPU {i}", self._href("gpu", i)) for i in ids)
        if key in ("pid", "kernel_log_pid", "ppid") and _is_int(value):
            if self.process is not None and self.process.pid == int(value):   # its own
                return [self._process(self.process)]
            return [Part(str(int(value)))]
        if key == "named" and isinstance(value, list):
            # [pid, name, start time or None] a kernel-log line names: its processes
            return _joined(self._named(v) for v in value)
        if key == "immediate" and isinstance(value, str):
            return [Part(RESOLUTIONS.get(value, value.replace("_", " ").lower()))]
        if key == "rule_kind" and isinstance(value, str):
            return [Part(RULE_KINDS.get(value, value))]
        if key in ("events", "driver_calls") and isinstance(value, list):
            # stored rows of the process's event list: linked to it, at the step's time
            href = self._href("events", self.process) if self.process else None
            return _joined(Part(f"#{compact(v)}", href) for v in value)
        if isinstance(value, list):
            return _joined(Part(compact(v)) for v in value)
        if isinstance(value, Mapping):
            found = _process_key(value)
            return [self._process(found)] if found else [Part(compact(value))]
        return [self.scalar(key, value)]

    def scalar(self, key: str, value: Any) -> Part:
        if isinstance(value, bool):
            return Part("yes" if value else "no")
        if not isinstance(value, int | float):
            return Part(compact(value))
        if key in TIME_KEYS or key.endswith("_at"):
            return _instant(int(value))
        if key in CODE_NAMES and _is_int(value):
            known = CODE_NAMES[key].get(int(value))
            return Part(f"{int(value)} ({known})" if known else str(int(value)))
        if _is_int(value) and (key in ID_KEYS or key.endswith("_id")):
            return Part(str(value))
        return Part(quantity(key, value))

    def _named(self, value: Any) -> Part:
        """One process a kernel-log line names: linked where its start time is known, the
        pid as the kernel wrote it (no thousands separator), its name after it."""
        if not isinstance(value, list | tuple) or not value or not _is_int(value[0]):
            return Part(compact(value))
        pid, rest = int(value[0]), list(value[1:])
        name = f" ({rest[0]})" if rest and isinstance(rest[0], str) and rest[0] else ""
        if len(rest) > 1 and _is_int(rest[1]):
            key = ProcessKey(pid, int(rest[1]))
            return Part(f"process {key}{name}", self._href("process", key))
        return Part(f"pid {pid}{name}")

    def _process(self, key: ProcessKey) -> Part:
        return Part(f"process {key}", self._href("process", key))

    def _href(self, kind: str, ident: Any) -> str | None:
        return self.link(kind, ident, self.at) if self.link else None


def _instant(ns: int, lead: str = "") -> Part:
    return Part(format_ts(ns, utc=True), ns=ns, lead=lead)


def _joined(parts: Iterable[Part]) -> list[Part]:
    out = []
    for i, part in enumerate(parts):
        out.append(Part(part.text, part.href, part.ns, ", " if i else ""))
    return out


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _process_key(value: Any) -> ProcessKey | None:
    """A process named as ``"PID-START"`` or ``{pid, start_time}``, else None."""
    if isinstance(value, str):
        found = _PROCESS_TEXT.fullmatch(value)
        return ProcessKey(int(found[1]), int(found[2])) if found else None
    if isinstance(value, Mapping) and set(value) == {"pid", "start_time"} and \
            _is_int(value["pid"]) and _is_int(value["start_time"]):
        return ProcessKey(value["pid"], value["start_time"])
    return None
