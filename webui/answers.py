"""The answer per GPU where a person looks: the one answer (``gpuwhy why``'s,
:func:`gpuwhy.store.queries.gpu_verdicts`) shaped for the pages, and its JSON
(``/api/answers``, ``/api/gpus/<id>/answer``).

The rules the answer ranks with are the service's (:func:`configured_rule_set`), loaded once
per app. Nothing here decides anything: the order, the sentence and why a candidate ranks
lower are :mod:`gpuwhy.rules.answer`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flask import Blueprint, abort, current_app, jsonify
from flask.typing import ResponseReturnValue

from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.rules.answer import Answer, Verdict, ranks_lower, sentence, verdict_dict
from gpuwhy.rules.loader import configured_rule_set
from gpuwhy.rules.model import Rule
from gpuwhy.store.queries import gpu_verdicts
from gpuwhy.webui.db import get_db

bp = Blueprint("answers", __name__)
HEALTHY = "ok"           # the severity word of a GPU nothing holds on (the scale has none)
STALE_PERIODS = 3        # a sample older than this many sample periods is no live number


def rules() -> Mapping[str, Rule]:
    """The service's rules by id, loaded once per app (the answer ranks by their kinds)."""
    cached = current_app.extensions.get("gpuwhy.rules")
    if cached is None:
        cached = {r.id: r for r in configured_rule_set(current_app.config["GPUWHY"]).rules}
        current_app.extensions["gpuwhy.rules"] = cached
    return cached


def verdicts() -> list[Verdict]:
    """Every GPU's answer now, worst first."""
    return gpu_verdicts(get_db(), rules())


def level(verdict: Verdict | None) -> str:
    """The verdict's severity on the one scale, or ``ok`` when nothing holds."""
    if verdict is None or verdict.healthy:
        return HEALTHY
    return sev.normalise(verdict.severity) if sev.is_severity(verdict.severity) else \
        verdict.severity


def said(verdict: Verdict) -> str:
    """The answer's sentence without the GPU's label and the bracketed severity (the page
    shows both beside it): "lost: it no longer answers (Xid 79: …); since …"."""
    line = sentence(verdict, utc=True)
    head = f"{verdict.gpu.label} — "
    line = line[len(head):] if line.startswith(head) else line
    tag = f"[{verdict.severity}] "
    return line[len(tag):] if line.startswith(tag) else line


@dataclass(frozen=True)
class Candidate:
    """Another answer on the GPU, and why it ranks below the one that leads."""

    answer: Answer
    why_lower: str

    @property
    def level(self) -> str:
        name = self.answer.finding.severity
        return sev.normalise(name) if sev.is_severity(name) else name


def others(verdict: Verdict) -> list[Candidate]:
    """The candidates that do not lead, best first, each with why it ranks lower."""
    lead = verdict.lead
    return [Candidate(a, ranks_lower(a, lead) if lead is not None else
                      "the GPU's health state leads")
            for a in verdict.candidates if a is not lead]


def sample_age(sample: Mapping | None, now: int | None = None) -> dict:
    """How old a GPU's latest sample is: ``ts``, ``age_s`` (whole seconds), and ``stale``
    once older than STALE_PERIODS sample periods (the ``gpu.interval`` setting); no sample:
    ``ts`` None and ``stale`` True (nothing live to show, never a 0)."""
    ts = sample.get("ts") if sample else None
    if not isinstance(ts, int):
        return {"ts": None, "age_s": None, "stale": True, "limit_s": stale_after_s()}
    age = max(0, (now if now is not None else now_ns()) - ts) / NS_PER_SECOND
    return {"ts": ts, "age_s": int(age), "stale": age > stale_after_s(),
            "limit_s": stale_after_s()}


def stale_after_s() -> float:
    """Seconds after which a sample is no live number: three sample periods."""
    return STALE_PERIODS * float(current_app.config["GPUWHY"]["gpu.interval"])


@bp.get("/api/answers")
def api_answers() -> ResponseReturnValue:
    """The answer on every GPU, worst first (``gpuwhy why --json``'s verdicts)."""
    return jsonify([verdict_dict(v) for v in verdicts()])


@bp.get("/api/gpus/<gpu_id>/answer")
def api_answer(gpu_id: str) -> ResponseReturnValue:
    found = next((v for v in verdicts() if v.gpu.gpu_id == gpu_id), None)
    if found is None:
        abort(404, description=f"no GPU {gpu_id!r} in the store")
    return jsonify(verdict_dict(found))
