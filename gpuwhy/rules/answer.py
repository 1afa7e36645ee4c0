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

from gpuwhy import gpu_health as gh
from gpuwhy import severity as sev
from gpuwhy.events import RuleFinding
from gpuwhy.quantities import label, quantity
from gpuwhy.rules.model import CAUSE, KINDS, SYMPTOM, Rule
from gpuwhy.text import format_ts
from gpuwhy.xid import xid_info

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


def described(finding: RuleFinding) -> bool:
    """Whether the finding carries what the ranking reads of its rule (kind, explains,
    scope, group), as the rules engine sends and the store keeps it since m126: then the
    finding is read, not the rule files of whoever reads it (`gpuwhy why` loads none; a
    rule edited since the finding was made does not rewrite it)."""
    return finding.rule_kind in KINDS and bool(finding.scope)


def kind_of(finding: RuleFinding, rules: Mapping[str, Rule]) -> str:
    """The finding's kind: its own when :func:`described`, else its rule's, else what the
    finding says, else CAUSE."""
    if described(finding):
        return finding.rule_kind
    rule = rules.get(finding.rule_id)
    kind = rule.kind if rule is not None else finding.rule_kind
    return kind if kind in KINDS else CAUSE


def explains_of(finding: RuleFinding, rules: Mapping[str, Rule]) -> tuple[str, ...]:
    """The symptom rule ids the finding's rule explains (the finding's own when
    :func:`described`, else its rule's, else the finding's)."""
    if described(finding):
        return tuple(finding.explains)
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
    """The rule's scope; else what the finding says (its sender's rule); else, from a sender
    that predates ``scope``, "process" when it names one."""
    rule = None if described(finding) else rules.get(finding.rule_id)
    if rule is not None:
        return rule.scope
    if finding.scope:
        return finding.scope
    return "process" if finding.process is not None else "gpu"


# A finding of this group on one GPU can be the effect of a failure on another: a GPU that
# waits in a collective waits for a peer, and a peer whose GPU failed never comes.
WAITS_ON_PEERS = "communication"
FAILURES = "failures"


def _group(finding: RuleFinding, rules: Mapping[str, Rule]) -> str:
    rule = None if described(finding) else rules.get(finding.rule_id)
    return rule.group if rule is not None else finding.group


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


def explains(cause: RuleFinding, symptom: RuleFinding, rules: Mapping[str, Rule]) -> bool:
    """Whether ``cause`` explains ``symptom``: its rule lists the symptom's rule and both are
    about the same work (:func:`_same_work`). The one test of "explains", for the answers
    here and for the incidents the correlator links (correlator/incidents.py)."""
    return symptom.rule_id in explains_of(cause, rules) and _same_work(cause, symptom, rules)


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
        mine = [s for s in symptoms if explains(cause, s, rules)
                and cause.ts >= s.window_start]
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
    explaining = {c.finding_id: [f for f in live if f is not c and explains(c, f, rules)]
                  for c in causes}
    # A cause another present cause explains (pageable copies -> launch gaps, a failed GPU
    # -> its peers' collective hang) is evidence, not an answer, unless they explain each
    # other (then both stay, ranked as usual).
    by_id = {c.finding_id: c for c in causes}
    effects = {f.finding_id for c in causes for f in explaining[c.finding_id]
               if kind_of(f, rules) == CAUSE
               and by_id[c.finding_id] not in explaining.get(f.finding_id, [])}
    for cause in causes:
        if cause.finding_id in effects:
            continue
        mine = sorted(f.finding_id for f in explaining[cause.finding_id])
        explained.update(mine)
        found.append(Answer(cause, CAUSE, tuple(mine)))
    for cause, held_for in _held(findings, symptoms, rules).values():
        ids = sorted(f.finding_id for f in held_for)
        explained.update(ids)
        found.append(Answer(cause, CAUSE, tuple(ids), held_until=cause.ts))
    for symptom in symptoms:
        if symptom.finding_id in explained:
            continue
        missing = tuple(symptom.unexplained) or tuple(missing_for(symptom.rule_id, rules))
        found.append(Answer(symptom, SYMPTOM, (), False, missing))
    return sorted(found, key=_order)


def answering_cause(symptom: RuleFinding, causes: Iterable[RuleFinding],
                    rules: Mapping[str, Rule]) -> RuleFinding | None:
    """Of the firing ``causes``, the one whose answer carries ``symptom``: the best-ranked
    answer that explains it (:func:`answers`), None when none does. The correlator links a
    new symptom's incident to this cause's, so the incident and the answer agree."""
    for answer in answers([*causes, symptom], rules):
        if answer.kind == CAUSE and symptom.finding_id in answer.explained:
            return answer.finding
    return None


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


# --- the answer per GPU: rule answers and the GPU's health together --------------------------
# How bad each health state is on the severity scale. A GPU that needs a reset or a reboot,
# or no longer answers, is unusable: critical, as its Xid's catalogue entry is. A reset under
# way and a degraded GPU still run work.
HEALTH_SEVERITY = {gh.OK: "", gh.DEGRADED: "warning", gh.RESETTING: "warning",
                   gh.RESET_REQUIRED: "critical", gh.REBOOT_REQUIRED: "critical",
                   gh.LOST: "critical"}
# In words, for the sentence that leads when the health state is the answer.
HEALTH_WORDS = {gh.DEGRADED: "degraded", gh.RESETTING: "a reset is under way",
                gh.RESET_REQUIRED: "unusable until a GPU reset",
                gh.REBOOT_REQUIRED: "unusable until the node reboots",
                gh.LOST: "lost: it no longer answers"}


@dataclass(frozen=True)
class GpuFacts:
    """What the answer needs to know of one GPU besides the findings: how a person names
    it, and its health state (:mod:`gpuwhy.gpu_health`) with what put it there."""

    gpu_id: str
    index: int | None = None
    model: str = ""
    pci: str = ""
    health: str = gh.OK
    health_since: int | None = None
    health_cause: str = ""          # e.g. "xid 79", "throttling"
    health_clears: str = ""
    # the inference engine serving from this GPU (probes/engines), if any: its name as its
    # project writes it, and the GPUs it spans (tensor parallel), as people name them
    engine: str = ""
    engine_gpus: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``GPU 2 · H100 80GB HBM3 · 0000:38:00.0``: index, model, PCI address, as known."""
        parts = [f"GPU {self.index}" if self.index is not None else f"GPU {self.gpu_id}"]
        if self.model:
            parts.append(self.model)
        if self.pci and self.pci != self.gpu_id:
            parts.append(self.pci)
        return " · ".join(parts)


@dataclass(frozen=True)
class Verdict:
    """The one answer on one GPU: the rule answer that leads (``lead``; None when the GPU's
    health leads or nothing holds), whether the health state leads instead, and every
    candidate on the GPU best first (the lead among them)."""

    gpu: GpuFacts
    severity: str                   # "" when healthy
    lead: Answer | None
    health_leads: bool
    candidates: tuple[Answer, ...] = ()
    explains: tuple[str, ...] = ()  # titles of the symptoms the lead explains

    @property
    def healthy(self) -> bool:
        return not self.severity

    @property
    def since(self) -> int | None:
        """When what leads began: the health state's entry, or the finding's onset."""
        if self.health_leads:
            return self.gpu.health_since
        if self.lead is not None:
            f = self.lead.finding
            return f.since or f.window_end or f.ts
        return None


def _leads_over_health(answer: Answer, rules: Mapping[str, Rule]) -> bool:
    """A failure finding (an Xid, an ECC error, a reset) names what the health state is
    about, with evidence and a fix: it leads rather than the bare state."""
    return answer.kind == CAUSE and _group(answer.finding, rules) == FAILURES


def _failure_behind(gpu: GpuFacts, findings: list[RuleFinding],
                    rules: Mapping[str, Rule]) -> Answer | None:
    """The failure finding behind a health state that outlived it: the latest failure cause
    on the GPU that cleared after the state was entered (R32 reads its Xid line for one
    minute; the GPU stays lost until a reboot, and the finding keeps its evidence and fix)."""
    behind = [f for f in findings if f.gpu_id == gpu.gpu_id and f.state != "firing"
              and not f.shadow and kind_of(f, rules) == CAUSE and _group(f, rules) == FAILURES
              and (gpu.health_since is None or f.ts >= gpu.health_since)]
    if not behind:
        return None
    latest = max(behind, key=lambda f: (f.ts, f.finding_id))
    return Answer(latest, CAUSE, held_until=latest.ts)


def _verdict_order(verdict: Verdict) -> tuple:
    """Worst first; between equal severities the better answer (as :func:`answers` ranks
    them: a cause before a symptom, ...), then the GPU's index."""
    lead = verdict.lead
    return (sev.sort_key(verdict.severity) if verdict.severity else 1,
            not verdict.health_leads, _order(lead) if lead is not None else (),
            verdict.gpu.index is None, verdict.gpu.index or 0, verdict.gpu.gpu_id)


def verdicts(gpus: Iterable[GpuFacts], findings: Iterable[RuleFinding],
             rules: Mapping[str, Rule]) -> list[Verdict]:
    """The answer on every GPU, worst first: the GPU's best rule answer (:func:`answers`),
    unless its health state is worse than that answer's severity and no failure finding
    speaks for it. A failure finding speaks for it while firing, or after it cleared while
    the state it caused holds (a GPU that fell off the bus stays the answer after the rule
    that saw its Xid line has cleared); without one the health state itself leads, worded
    from the Xid catalogue. A GPU a finding names but ``gpus`` does not is answered too
    (known only from its finding)."""
    known = {g.gpu_id: g for g in gpus}
    findings = list(findings)
    titles = {f.finding_id: f.title for f in findings}
    by_gpu = answers_by_gpu(findings, rules)
    for gpu_id in by_gpu:
        known.setdefault(gpu_id, GpuFacts(gpu_id))
    found = []
    for gpu in known.values():
        mine = tuple(by_gpu.get(gpu.gpu_id, ()))
        top = mine[0] if mine else None
        health_sev = HEALTH_SEVERITY.get(gpu.health, "")
        failure = next((a for a in mine if _leads_over_health(a, rules)), None)
        if failure is None and health_sev:
            failure = _failure_behind(gpu, findings, rules)
            if failure is not None:
                mine = (failure, *mine)
        top_sev = top.finding.severity if top is not None else ""
        health_leads = bool(health_sev) and failure is None and (
            top is None or sev.rank(health_sev) > sev.rank(sev.worst([top_sev or "info"])))
        lead = None if health_leads else failure or top
        severities = [s for s in (health_sev, top_sev,
                                  lead.finding.severity if lead is not None else "") if s]
        severity = sev.worst(severities) if severities else ""
        explains = tuple(dict.fromkeys(titles[i] for i in lead.explained if i in titles)) \
            if lead is not None else ()
        found.append(Verdict(gpu, severity, lead, health_leads, mine, explains))
    return sorted(found, key=_verdict_order)


def _health_cause(gpu: GpuFacts) -> tuple[str, str]:
    """The health state's cause in words and its fix: an Xid's catalogue title and action."""
    cause = gpu.health_cause
    kind, _, code = cause.partition(" ")
    if kind == "xid" and code.isdigit():
        info = xid_info(int(code))
        return f"Xid {code}: {info.title}", info.action
    return cause.replace("_", " "), f"clears on {gpu.health_clears}" if gpu.health_clears else ""


def sentence(verdict: Verdict, *, utc: bool = False) -> str:
    """The answer on one GPU in one line, as `gpuwhy why` prints it, worst first:
    ``GPU 2 · H100 · 0000:38:00.0 — <what leads>; explains <symptoms>; since <time>;
    fix: <first fix>``; ``GPU 0 · … — healthy`` when nothing holds."""
    gpu = verdict.gpu
    if verdict.healthy:
        return f"{gpu.label} — healthy"
    parts: list[str] = []
    if verdict.health_leads:
        cause, fix = _health_cause(gpu)
        parts.append(f"{HEALTH_WORDS.get(gpu.health, gpu.health)}"
                     + (f" ({cause})" if cause else ""))
    else:
        answer = verdict.lead
        assert answer is not None      # not healthy and health does not lead
        f = answer.finding
        title = f.title or f.rule_id
        if not answer.cause_established:
            title += " (cause not established)"
        if gpu.engine:                 # a serving engine's GPU: said in its own terms
            title = f"{serving_name(gpu)}: {title}"
            measured = serving_figures(f.evidence)
            if measured:
                title += f" ({measured})"
        parts.append(title)
        fix = f.fixes[0] if f.fixes else ""
    if verdict.explains:
        parts.append("explains " + ", ".join(t[:1].lower() + t[1:] for t in verdict.explains))
    if verdict.since:
        parts.append("since " + format_ts(verdict.since, "min", utc=utc))
    if fix:
        parts.append(f"fix: {fix}")
    return f"{gpu.label} — [{verdict.severity}] " + "; ".join(parts)


def serving_name(gpu: GpuFacts) -> str:
    """``vLLM on GPU 0–1 (tensor parallel 2)``; ``vLLM on GPU 0``."""
    spans = gpu.engine_gpus or (str(gpu.index) if gpu.index is not None else gpu.gpu_id,)
    where = f"GPU {spans[0]}" if len(spans) == 1 else \
        f"GPUs {', '.join(spans)} (tensor parallel {len(spans)})"
    return f"{gpu.engine} on {where}"


# What an engine's latency and load are read by, in the order a person asks about them
# (the serving rules' evidence names, gpuwhy/rules/builtin/j_serving.rules and R48)
SERVING_FIGURES = ("kv_cache_usage", "preemptions_per_s", "ttft_p95_s", "itl_p95_s",
                   "waiting", "main_thread_on_cpu")


def serving_figures(evidence: Mapping[str, object], most: int = 3) -> str:
    """The finding's serving figures in words: "KV cache usage 97%, preemptions 6.5/min"."""
    said = []
    for name in SERVING_FIGURES:
        value = evidence.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if name == "preemptions_per_s":     # a rare event: per minute reads better
                said.append(f"{label(name, value)} {value * 60:.3g}/min")
            else:
                said.append(f"{label(name, value)} {quantity(name, value)}")
    return ", ".join(said[:most])


def ranks_lower(candidate: Answer, lead: Answer) -> str:
    """Why ``candidate`` is not the answer while ``lead`` is, in words (``rank_key``'s
    terms, first difference first)."""
    if candidate.finding.finding_id in lead.explained:
        return "a symptom the answer explains"
    if lead.held_until is None and candidate.held_until is not None:
        return "a cause that has cleared"
    if candidate.kind != lead.kind:
        return "a symptom; the answer is a cause"
    if len(candidate.explained) != len(lead.explained):
        return (f"explains {len(candidate.explained)} present symptom(s), the answer "
                f"{len(lead.explained)}")
    if sev.rank(sev.worst([candidate.finding.severity])) != sev.rank(
            sev.worst([lead.finding.severity])):
        return f"less severe ({candidate.finding.severity} against {lead.finding.severity})"
    return "ranked after it by rule id (otherwise equal)"


def _answer_dict(answer: Answer) -> dict[str, object]:
    f = answer.finding
    return {"rule_id": f.rule_id, "finding_id": f.finding_id, "title": f.title,
            "kind": answer.kind, "severity": f.severity, "group": f.group,
            "cause_established": answer.cause_established, "missing": list(answer.missing),
            "explains": list(answer.explained), "held_until": answer.held_until,
            "since": f.since or None, "process": None if f.process is None else
            {"pid": f.process.pid, "start_time": f.process.start_time},
            "instance": f.instance, "root_cause": f.root_cause, "evidence": f.evidence,
            "fixes": list(f.fixes), "verify": f.verify}


def verdict_dict(verdict: Verdict) -> dict[str, object]:
    """A verdict as JSON-ready values: what `gpuwhy why --json` prints and the API serves."""
    gpu = verdict.gpu
    lead = verdict.lead
    return {
        "gpu": {"id": gpu.gpu_id, "index": gpu.index, "model": gpu.model, "pci": gpu.pci,
                "label": gpu.label, "health": gpu.health, "health_since": gpu.health_since,
                "health_cause": gpu.health_cause, "health_clears": gpu.health_clears,
                "engine": gpu.engine or None, "engine_gpus": list(gpu.engine_gpus)},
        "severity": verdict.severity or None, "healthy": verdict.healthy,
        "sentence": sentence(verdict, utc=True), "since": verdict.since,
        "health_leads": verdict.health_leads,
        "lead": None if lead is None else _answer_dict(lead),
        "explains": list(verdict.explains),
        "candidates": [{**_answer_dict(a), "ranks_lower": None if a is lead or lead is None
                        else ranks_lower(a, lead)} for a in verdict.candidates],
    }
