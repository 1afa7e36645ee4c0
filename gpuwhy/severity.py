"""The one severity scale of gpuwhy: its order, the older names it accepts, journald levels.

``info < warning < error < critical``, everywhere: rule files, rule findings, incidents,
the Xid catalogue, alerts, the web view, ``/metrics`` and the store. The names and the
order are defined here only; every other module imports them (tests/test_severity.py
holds it to that). ``warn`` and ``high``, the rule files' names before the scales were
one, are read as ``warning`` and ``error`` (store migration m103 rewrote stored rows).
"""

from __future__ import annotations

from collections.abc import Iterable

# Ascending: a severity's rank is its index.
SEVERITIES: tuple[str, ...] = ("info", "warning", "error", "critical")
# Worst first, the order lists and filters show them in.
DESCENDING: tuple[str, ...] = tuple(reversed(SEVERITIES))
# Older names, still accepted where a severity is read (rule files, events from an older
# rules process, rows stored before m103). Never extended: new names go in SEVERITIES.
LEGACY_NAMES: dict[str, str] = {"warn": "warning", "high": "error"}
# syslog levels for journald's PRIORITY (crit, err, warning, info); an incident is never
# an emergency or alert of the whole host, and notice (5) says nothing info does not.
JOURNAL_PRIORITY: dict[str, int] = {"critical": 2, "error": 3, "warning": 4, "info": 6}
# OpenTelemetry's SeverityNumber (its log data model: INFO 9, WARN 13, ERROR 17, FATAL 21) for
# an OTLP log record of this severity; critical (a GPU lost, one to reset) is FATAL: the
# GPU's work has stopped, not merely erred.
OTLP_SEVERITY_NUMBER: dict[str, int] = {"critical": 21, "error": 17, "warning": 13, "info": 9}
DEFAULT = "warning"


class UnknownSeverity(ValueError):
    """A name that is on neither the scale nor its legacy names."""


def accepted() -> str:
    """The names a severity may be written as, for error messages."""
    legacy = ", ".join(f"{old} (= {new})" for old, new in LEGACY_NAMES.items())
    return f"{', '.join(SEVERITIES)}; older names: {legacy}"


def normalise(name: str) -> str:
    """The scale's name of ``name`` (a legacy name mapped); UnknownSeverity otherwise."""
    if name in SEVERITIES:
        return name
    try:
        return LEGACY_NAMES[name]
    except (KeyError, TypeError):
        raise UnknownSeverity(f"unknown severity {name!r}: expected {accepted()}") from None


def is_severity(name: str) -> bool:
    """Whether ``name`` is on the scale or a legacy name of it."""
    return name in SEVERITIES or name in LEGACY_NAMES


def rank(name: str) -> int:
    """0 for info up to 3 for critical; a legacy name ranks as its new one."""
    return SEVERITIES.index(normalise(name))


def _rank_or_below(name: str) -> int:
    # A value from outside (an event, an old row) must not stop the decide stage: an
    # unknown name ranks below info, so any known severity beats it.
    return rank(name) if is_severity(name) else -1


def worst(names: Iterable[str]) -> str:
    """The highest severity of ``names``, normalised (an unknown name loses to any known)."""
    found = max(names, key=_rank_or_below)
    return normalise(found) if is_severity(found) else found


def journal_priority(name: str) -> int:
    """journald's PRIORITY for an alert of this severity (warning's for an unknown name)."""
    return JOURNAL_PRIORITY[normalise(name) if is_severity(name) else DEFAULT]


def sort_key(name: str) -> int:
    """A key that lists the worst first (unknown names last)."""
    return -_rank_or_below(name)


def otlp_severity_number(name: str) -> int:
    """OpenTelemetry's SeverityNumber for an incident of this severity (warning's for an
    unknown name)."""
    return OTLP_SEVERITY_NUMBER[normalise(name) if is_severity(name) else DEFAULT]
