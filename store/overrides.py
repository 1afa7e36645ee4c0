"""Per-rule overrides kept in the store: enabled, shadow, and threshold parameters."""

from __future__ import annotations

import json
import sqlite3

from sqlite_utils import Database

from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.rules.model import Override, Rule


class OverrideError(GpuwhyError):
    """An override names an unknown rule or parameter, or a value of the wrong kind."""


def read_overrides(db: Database) -> dict[str, Override]:
    """Every stored override by rule id; empty when the table is not there yet."""
    try:
        rows = db.execute("select rule_id, enabled, shadow, params from rule_overrides").fetchall()
    except sqlite3.OperationalError:
        return {}
    out = {}
    for rule_id, enabled, shadow, params in rows:
        try:
            values = {k: float(v) for k, v in json.loads(params or "{}").items()}
        except (ValueError, TypeError, AttributeError):
            values = {}
        out[rule_id] = Override(enabled=enabled is None or bool(enabled), shadow=bool(shadow),
                                params=values)
    return out


def _boolean(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise OverrideError(f"{name} must be true or false, got {text!r}")


def set_override(db: Database, rule: Rule, enabled: str | None = None,
                 shadow: str | None = None, thresholds: dict[str, str] | None = None,
                 reset: bool = False) -> Override:
    """Change the stored override of ``rule`` (one transaction) and return it.

    ``thresholds`` maps parameter names the rule declares to new values.
    """
    current = Override() if reset else read_overrides(db).get(rule.id, Override())
    params = dict(current.params)
    for name, text in (thresholds or {}).items():
        if name not in rule.params:
            known = ", ".join(rule.params) or "none"
            raise OverrideError(f"rule {rule.id} has no threshold {name!r} (it has: {known})")
        try:
            params[name] = float(text)
        except ValueError:
            raise OverrideError(f"threshold {name} must be a number, got {text!r}") from None
    new = Override(enabled=current.enabled if enabled is None else _boolean("enabled", enabled),
                   shadow=current.shadow if shadow is None else _boolean("shadow", shadow),
                   params=params)
    with db.atomic():
        db.table("rule_overrides").upsert({"rule_id": rule.id, "enabled": int(new.enabled),
                                     "shadow": int(new.shadow),
                                     "params": json.dumps(params, sort_keys=True),
                                     "updated_at": now_ns()}, pk="rule_id")
    return new
