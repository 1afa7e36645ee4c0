"""The right first answer: of the firing findings on a GPU, the cause that explains the most,
never whichever fired first.

A rule is a cause or a symptom (``kind:``, :mod:`gpuwhy.rules.model`); a cause lists the
symptom rules it explains (``explains:``). Here, per GPU, each firing cause is an answer
whose ``explained`` are the present symptoms it explains, and each symptom no present cause
explains is an answer of its own that says its cause is not established and what is
missing. A cause that cleared inside a firing symptom's evaluation window still explains
it (the samples that make the symptom are the cause's too: a job that ran out of memory and
died leaves its GPU's "bursty" window behind it), as the symptom's incident stays a link of
the cause's; it answers only for such symptoms, after the causes firing now. Answers are
ranked by :func:`rank_key`: causes above symptoms, then the number of present symptoms
explained, then severity (:mod:`gpuwhy.severity`), then confidence; ties go by rule and
finding id, so the order never depends on which finding arrived first.

Pure functions: no I/O, no clock. docs/rules.md, "How the answer is chosen".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuwhy import severity as sev
from gpuwhy.events import RuleFinding
from gpuwhy.rules.model import CAUSE, KINDS, SYMPTOM, Rule

# A kind's rank: higher is a better answer; an unknown kind is read as a cause, as the
# parser reads a rule without 'kind:'.
KIND_RANK = {SYMPTOM: 0, CAUSE: 1}


@dataclass(frozen=True)
class Answer:
    """One answer on a GPU: a firing ``finding``, its ``kind`` (CAUSE or SYMPTOM), the
    finding ids of the present symptoms it explains, whether a cause is established (False
    only for a symptom no present cause explains) and, then, what is missing to tell."""

    finding: RuleFinding
    kind: str
    explained: tuple[str, ...] = ()
    cause_established: bool = True
    missing: tuple[str, ...] = ()
    held_until: int | None = None     # a cause that cleared then (ns); None: firing now

    @property
    def gpu_id(self) -> str:
        return self.finding.gpu_id

    @property
    def rule_id(self) -> str:
        return self.finding.rule_id


def rank_key(kind: str, severity: str, confidence: float | None = None,
             specificity: int = 0) -> tuple:
    """A sort key, best answer first (ascending): kind (cause before symptom), then
    ``specificity`` (present symptoms explained), then severity, then confidence."""
    return (-KIND_RANK.get(kind, KIND_RANK[CAUSE]), -specificity, sev.sort_key(severity),
            -(confidence if confidence is not None else 0.0))


def kind_of(finding: RuleFinding, rules: Mapping[str, Rule]) -> str:
    """The finding's kind: its rule's, else what the finding says, else CAUSE."""
    rule = rules.get(finding.rule_id)
    kind = rule.kind if rule is not None else finding.rule_kind
    return kind if kind in KINDS else CAUSE


def explains_of(finding: RuleFinding, rules: Mapping[str, Rule]) -> tuple[str, ...]:
    """The symptom rule ids the finding's rule explains (its rule's, else the finding's)."""
    rule = rules.get(finding.rule_id)
    return tuple(rule.explains) if rule is not None else tuple(finding.explains)


def explained_by(symptom_id: str, rules: Mapping[str, Rule]) -> list[Rule]:
    """The cause rules that list ``symptom_id`` in their ``explains``, in id order."""
    return sorted((r for r in rules.values() if r.kind == CAUSE and symptom_id in r.explains),
                  key=lambda r: r.id)


def missing_for(symptom_id: str, rules: Mapping[str, Rule]) -> list[str]:
    """Per cause rule that could explain the symptom: what it reads beyond the symptom's
    own inputs ("R01_input_cpu_bound not established: needs workers.cpu_cores, ...")."""
    symptom = rules.get(symptom_id)
    own = set(symptom.requires) if symptom is not None else set()
    lines = []
    for cause in explained_by(symptom_id, rules):
        extra = [name for name in cause.requires if name not in own]
        lines.append(f"{cause.id} not established: needs {', '.join(extra)}" if extra
                     else f"{cause.id} not established: not firing")
    return lines


def _scope(finding: RuleFinding, rules: Mapping[str, Rule]) -> str:
    rule = rules.get(finding.rule_id)
    if rule is not None:
        return rule.scope
    return "process" if finding.process is not None else "gpu"


# A finding of this group on one GPU can be the effect of a failure on another: a GPU that
# waits in a collective waits for a peer, and a peer whose GPU failed never comes.
WAITS_ON_PEERS = "communication"
FAILURES = "failures"


def _group(finding: RuleFinding, rules: Mapping[str, Rule]) -> str:
    rule = rules.get(finding.rule_id)
    return rule.group if rule is not None else ""


def _same_work(cause: RuleFinding, symptom: RuleFinding, rules: Mapping[str, Rule]) -> bool:
    """Same GPU, and the same process unless either finding is about the whole GPU, and the
    same MIG instance when both are about one; or a failure on one GPU and a wait in a
    collective on another (the waiting GPU's peer is the failed one: one host, one job in
    the cases that matter)."""
    if cause.gpu_id != symptom.gpu_id:
        return _group(cause, rules) == FAILURES and _group(symptom, rules) == WAITS_ON_PEERS
    if cause.instance and symptom.instance and cause.instance != symptom.instance:
        return False    # slices of one GPU are separate GPUs to their tenants
    if "gpu" in (_scope(cause, rules), _scope(symptom, rules)):
        return True
    return cause.process is None or symptom.process is None or cause.process == symptom.process


def firing(findings: Iterable[RuleFinding]) -> list[RuleFinding]:
    """The findings that count: firing and not shadow."""
    return [f for f in findings if f.state == "firing" and not f.shadow]


def _order(answer: Answer) -> tuple:
    f = answer.finding
    kind, *rest = rank_key(answer.kind, f.severity, specificity=len(answer.explained))
    return (kind, answer.held_until is not None, *rest, f.rule_id, f.gpu_id, f.finding_id)


def _held(findings: Iterable[RuleFinding], symptoms: list[RuleFinding],
          rules: Mapping[str, Rule]) -> dict[str, tuple[RuleFinding, list[RuleFinding]]]:
    """Cleared causes that held inside a present symptom's window: {id: (cause, symptoms)}."""
    held: dict[str, tuple[RuleFinding, list[RuleFinding]]] = {}
    for cause in findings:
        if cause.state == "firing" or cause.shadow or kind_of(cause, rules) != CAUSE:
            continue
        mine = [s for s in symptoms if s.rule_id in explains_of(cause, rules)
                and _same_work(cause, s, rules) and cause.ts >= s.window_start]
        if mine:
            held[cause.finding_id] = (cause, mine)
    return held


def answers(findings: Iterable[RuleFinding], rules: Mapping[str, Rule]) -> list[Answer]:
    """Every answer of the firing findings, best first (all GPUs together); ``findings`` may
    also hold cleared ones (their clearing): a cleared cause answers for the present symptoms
    whose window it held in (``held_until``), never on its own.

    Each cause is an answer, its ``explained`` the present symptoms it explains on its GPU
    (a symptom may be explained by several causes); each symptom no present cause explains
    is an answer with ``cause_established=False`` and ``missing``: the finding's own
    ``unexplained`` when its sender filled it, else :func:`missing_for`. A symptom some
    cause explains is no answer of its own.
    """
    live = firing(findings)
    causes = [f for f in live if kind_of(f, rules) == CAUSE]
    symptoms = [f for f in live if kind_of(f, rules) == SYMPTOM]
    found = []
    explained: set[str] = set()
    explains = {c.finding_id: [f for f in live if f is not c
                               and f.rule_id in explains_of(c, rules)
                               and _same_work(c, f, rules)] for c in causes}
    # A cause another present cause explains (pageable copies -> launch gaps, a failed GPU
    # -> its peers' collective hang) is evidence, not an answer, unless they explain each
    # other (then both stay, ranked as usual).
    by_id = {c.finding_id: c for c in causes}
    effects = {f.finding_id for c in causes for f in explains[c.finding_id]
               if kind_of(f, rules) == CAUSE
               and by_id[c.finding_id] not in explains.get(f.finding_id, [])}
    for cause in causes:
        if cause.finding_id in effects:
            continue
        mine = sorted(f.finding_id for f in explains[cause.finding_id])
        explained.update(mine)
        found.append(Answer(cause, CAUSE, tuple(mine)))
    for cause, mine in _held(findings, symptoms, rules).values():
        ids = sorted(f.finding_id for f in mine)
        explained.update(ids)
        found.append(Answer(cause, CAUSE, tuple(ids), held_until=cause.ts))
    for symptom in symptoms:
        if symptom.finding_id in explained:
            continue
        missing = tuple(symptom.unexplained) or tuple(missing_for(symptom.rule_id, rules))
        found.append(Answer(symptom, SYMPTOM, (), False, missing))
    return sorted(found, key=_order)


def answers_by_gpu(findings: Iterable[RuleFinding], rules: Mapping[str, Rule]
                   ) -> dict[str, list[Answer]]:
    """:func:`answers` per GPU id, each list best first."""
    grouped: dict[str, list[Answer]] = {}
    for answer in answers(findings, rules):
        grouped.setdefault(answer.gpu_id, []).append(answer)
    return grouped


def top_answer(findings: Iterable[RuleFinding], rules: Mapping[str, Rule],
               gpu_id: str | None = None) -> Answer | None:
    """The best answer on ``gpu_id`` (or over all GPUs when None); None without any."""
    for answer in answers(findings, rules):
        if gpu_id is None or answer.gpu_id == gpu_id:
            return answer
    return None
