"""The rules engine: every enabled rule, per GPU, per process or per MIG instance, on a
schedule.

Each (rule, GPU[, process | MIG instance]) instance walks a small state machine at every evaluation:
``disabled``, ``warming_up`` (G-WARMUP, or too little history), ``not_evaluable`` (a
required input is missing: never "ok"), ``suppressed`` (a guard holds, G-SHARED says skip,
or G-JOB-END: the GPU's job ended cleanly), ``ok``, ``pending`` (true, not yet for the
``for`` duration) and ``firing``. A finding is published when an instance starts firing,
again only when its severity changes (de-duplication), and once more when it clears (the
``clear`` condition, or the condition false for ``clear after``, by default twice ``for``;
at once when G-JOB-END begins to hold). Shadow rules publish findings marked ``shadow``:
recorded, never alerted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from gpuwhy import severity as sev
from gpuwhy.correlator.rules.evaluator import Evaluation, truth
from gpuwhy.correlator.rules.signals import (
    ProcessFacts,
    Scope,
    Signals,
    is_monitor,
    mig_order,
)
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import BACK_STATES, RESET_STATES
from gpuwhy.rules import model as m
from gpuwhy.rules.model import Override
from gpuwhy.rules.vocabulary import FACTS, PROCESS_TEXT, SIGNALS

RESET_WARMUP_NS = 60 * 10**9   # G-WARMUP after a GPU reset or driver load
DEFAULT_INTERVAL_NS = 10 * 10**9
# A GPU holds a CUDA context when its memory in use reaches this (a context alone takes some
# 300-500 MiB; an unused GPU reports the driver's few): R05's context_mib says the same
CONTEXT_MIB = 64
CONTEXT_LOOK_NS = 60 * 10**9
# G-JOB-END applies to the GPU rules that read the GPU's activity: a job that ended leaves
# the GPU idle, and that idle is not these rules' symptom.
JOB_END_SIGNALS = ("gpu.util", "gpu.busy")


@dataclass
class InstanceState:
    status: str = "new"
    detail: str = ""
    true_since: int | None = None
    false_since: int | None = None
    finding_id: str | None = None
    severity: str | None = None
    onset: int | None = None
    last_eval: int | None = None
    process: ProcessKey | None = None
    mig_profile: str = ""        # an instance rule's MIG instance's profile, "" unknown
    # The processes the instance looked at when the condition began to hold (true_since),
    # then the firing finding's: kept from onset to clearing, with its ``since``.
    true_processes: tuple[ProcessKey, ...] = ()
    processes: tuple[ProcessKey, ...] = ()
    since: int | None = None


def _round(value: object) -> object:
    if isinstance(value, float):
        if not math.isfinite(value):   # a series can hold one; round() would raise
            return None
        return round(value, 4) if abs(value) < 1e6 else round(value)
    return value


class Engine:
    """Evaluates ``rules`` against ``signals``; ``evaluate(now)`` returns new findings."""

    def __init__(self, rules: Iterable[m.Rule], signals: Signals,
                 overrides: Mapping[str, Override] | None = None, shadow_all: bool = False,
                 interval_ns: int = DEFAULT_INTERVAL_NS):
        self.rules = list(rules)
        self.signals = signals
        self.overrides = dict(overrides or {})
        self.shadow_all = shadow_all
        self.interval_ns = interval_ns
        # (rule id, GPU, process of a process rule, MIG instance of an instance rule)
        self.states: dict[tuple[str, str, ProcessKey | None, str], InstanceState] = {}
        # G-JOB-END: the compute processes seen on each GPU, with the last round they were
        # seen in; kept a little longer than the longest window (an exit is looked up there).
        self._seen_on: dict[str, dict[ProcessKey, int]] = {}
        self._seen_keep_ns = 2 * max((r.window_ns for r in self.rules), default=0) + \
            10 * interval_ns
        self.evaluations = 0
        self.errors = 0
        self._job_counts: dict[str, float] = {}
        # symptom rule id -> the cause rules that explain it (gpuwhy/rules/answer.py)
        self.explained_by: dict[str, list[m.Rule]] = {}
        for rule in self.rules:
            for symptom in rule.explains:
                self.explained_by.setdefault(symptom, []).append(rule)

    def set_overrides(self, overrides: Mapping[str, Override]) -> None:
        self.overrides = dict(overrides)

    # Instances.
    def _instances(self, now: int | None = None
                   ) -> list[tuple[m.Rule, Scope, tuple[str, str, ProcessKey | None, str]]]:
        out: list[tuple[m.Rule, Scope, tuple[str, str, ProcessKey | None, str]]] = []
        self._procs: dict[str, list[ProcessKey]] = {}
        self._profiles: dict[str, dict[str, str]] = {}
        self._facts: dict[ProcessKey, ProcessFacts | None] = {}
        for gpu in self.signals.gpus():
            compute = []
            for process in self.signals.processes(gpu):
                facts = self._facts.setdefault(process, self.signals.facts(process))
                if not is_monitor(facts):   # G-MONITOR
                    compute.append(process)
            compute.sort(key=lambda p: (known.first_seen or 0) if (known := self._facts[p])
                         else 0)
            self._procs[gpu] = compute
            if now is not None:
                seen = self._seen_on.setdefault(gpu, {})
                seen.update(dict.fromkeys(compute, now))
                for process in [p for p, last in seen.items()
                                if last < now - self._seen_keep_ns]:
                    del seen[process]
            slices = self.signals.instances(gpu) if any(
                r.scope == m.INSTANCE for r in self.rules) else {}
            self._profiles[gpu] = slices
            for rule in self.rules:
                if rule.scope == "gpu":
                    main = compute[0] if compute else None
                    out.append((rule, Scope(gpu, main), (rule.id, gpu, None, "")))
                elif rule.scope == m.INSTANCE:   # one per MIG instance with samples
                    for instance in slices:
                        out.append((rule, Scope(gpu, None, instance),
                                    (rule.id, gpu, None, instance)))
                else:
                    for process in compute:
                        out.append((rule, Scope(gpu, process), (rule.id, gpu, process, "")))
        return out

    def _job_gpus(self, process: ProcessKey) -> float | None:
        """On how many GPUs the process's job computes: the GPUs with a compute process of
        the same command line (a job's ranks on this host run one command), its own among
        them; None when its command line is not known."""
        facts = self._facts.get(process)
        if facts is None or not facts.cmdline:
            return None
        counts = self._job_counts
        if facts.cmdline not in counts:
            counts[facts.cmdline] = float(sum(
                1 for procs in self._procs.values()
                if any(p == process or ((other := self._facts.get(p)) is not None
                                        and other.cmdline == facts.cmdline)
                       for p in procs)))
        return counts[facts.cmdline]

    def _contexts(self, gpu_id: str) -> float:
        """How many processes hold a context on the GPU: its compute-process list (NVML)
        where the source sends one, else from the device files. CUDA opens every visible
        GPU's /dev/nvidiaN, so each rank of a torchrun job or vLLM's tensor-parallel workers
        holds all of them while driving one: a process on k GPUs counts 1/k on each (a
        whole job spread over its GPUs is one context each, two jobs on them are two)."""
        found = self._context_counts.get(gpu_id)
        if found is None:
            compute = self._procs.get(gpu_id, [])
            listed = self.signals.process_list(gpu_id)
            if listed is not None:
                found = float(len([p for p in listed if p in compute or
                                   not is_monitor(self._facts.get(p))]))
            elif not self._holds_a_context(gpu_id):
                found = 0.0
            else:
                spread: dict[ProcessKey, int] = {}
                for gpu, procs in self._procs.items():
                    if self._holds_a_context(gpu):
                        for p in procs:
                            spread[p] = spread.get(p, 0) + 1
                found = sum(1.0 / spread[p] for p in compute if p in spread)
            self._context_counts[gpu_id] = found
        return found

    def _holds_a_context(self, gpu_id: str) -> bool:
        """Whether the GPU holds a CUDA context's memory over the last minute: a process
        that only opened its device file (every visible GPU's is opened) runs nothing there,
        and an unused GPU reports the driver's few MiB. Without a memory figure, it may."""
        held = self._occupied.get(gpu_id)
        if held is None:
            now = self.signals.now()
            used = self.signals.series(Scope(gpu_id), "gpu.fb_used", now - CONTEXT_LOOK_NS,
                                       now)
            held = not used or max(value for _, value in used) >= CONTEXT_MIB
            self._occupied[gpu_id] = held
        return held

    def evaluate(self, now: int | None = None) -> list[RuleFinding]:
        """One round: every instance that is due. Returns the findings to publish."""
        now = self.signals.now() if now is None else now
        self.signals.begin(now)
        self._shared: dict = {}
        self._params: dict[str, dict[str, float]] = {}
        self._context_counts: dict[str, float] = {}
        self._occupied: dict[str, bool] = {}
        self._job_counts = {}   # command line -> GPUs its processes use
        findings: list[RuleFinding] = []
        seen = set()
        for rule, scope, key in self._instances(now):
            seen.add(key)
            state = self.states.setdefault(key, InstanceState())
            every = rule.every_ns or self.interval_ns
            if state.last_eval is not None and now - state.last_eval < every - every // 10:
                continue
            state.last_eval = now
            state.process = scope.process
            if scope.instance:
                state.mig_profile = self._profiles.get(scope.gpu_id, {}).get(
                    scope.instance) or state.mig_profile
            self.evaluations += 1
            finding = self._step(rule, scope, state, now)
            if finding is not None:
                findings.append(finding)
        for key in [k for k in self.states if k not in seen]:   # GPU or process gone
            state = self.states.pop(key)
            gone = next((r for r in self.rules if r.id == key[0]), None)
            if state.status == "firing" and gone is not None:
                scope = Scope(key[1], key[2] or state.process, key[3])
                findings.append(self._finding(gone, scope, state, now, "cleared", {}, [],
                                              self.overrides.get(gone.id, Override())))
        return findings

    def _step(self, rule: m.Rule, scope: Scope, state: InstanceState,
              now: int) -> RuleFinding | None:
        override = self.overrides.get(rule.id, Override())
        if not override.enabled:
            cleared = self._clear_now(rule, scope, state, now, override)
            state.status, state.detail = "disabled", "disabled by an override"
            return cleared
        params = self._params.get(rule.id)
        if params is None:   # one dict per rule and round: the evaluator's caches key on it
            params = self._params[rule.id] = {
                **rule.params, **{k: v for k, v in override.params.items() if k in rule.params}}
        facts = self._facts.get(scope.process) if scope.process else None
        # The GPU's process counts; not a MIG instance's (which process runs in which
        # instance is not known here): an instance rule reading them is not evaluable.
        instance = {} if scope.instance else {
            "gpu.procs": float(len(self._procs.get(scope.gpu_id, []))),
            "gpu.contexts": self._contexts(scope.gpu_id)}
        if scope.process is not None and not scope.instance:
            job_gpus = self._job_gpus(scope.process)
            if job_gpus is not None:
                instance["proc.job_gpus"] = job_gpus
        if facts is not None and facts.born is not None:
            instance["proc.age_s"] = (now - facts.born) / 1e9
        ev = Evaluation(self.signals, scope, now, params, rule.window_ns, facts, instance,
                        self._shared)
        ended = self._job_ended(rule, scope, now)
        if ended:
            cleared = self._clear_now(rule, scope, state, now, override)
            state.status, state.detail, state.true_since = "suppressed", ended, None
            return cleared
        if rule.shared == "skip" and instance.get("gpu.contexts", 0) >= 2:
            state.status, state.detail = "suppressed", "G-SHARED: several compute processes"
            state.true_since = None
            return None
        warming = self._warming(rule, ev, instance, now)
        if warming:
            state.status, state.detail, state.true_since = "warming_up", warming, None
            return None
        missing = self._missing_requirements(rule, ev, facts)
        if missing:
            warming_only = all(name.endswith("(warming up)") for name in missing)
            state.status = "warming_up" if warming_only else "not_evaluable"
            state.detail = "missing: " + ", ".join(missing)
            state.true_since = None
            return None
        guarded = next((g for g in rule.guards if truth(ev.value(g)) is True), None)
        # a loaded rule has a 'when:' (the parser refuses one without)
        holds = False if guarded is not None else truth(ev.value(cast(m.Node, rule.when)))
        if holds is None:
            state.status = "not_evaluable"
            state.detail = "unknown: " + ", ".join(sorted(ev.missing)) if ev.missing else \
                "condition unknown"
            state.true_since = None
            return None
        if holds:
            state.false_since = None
            if state.true_since is None:
                state.true_since = now
                state.true_processes = self._named(rule, scope)
            if now - state.true_since < rule.for_ns:
                if state.status != "firing":
                    state.status, state.detail = "pending", ""
                return None
            severity = self._severity(rule, ev, instance)
            if state.status == "firing" and severity == state.severity:
                return None
            state.status, state.detail = "firing", ""
            if state.finding_id is None:
                state.onset = state.true_since
                process = f"{scope.process}" if scope.process else \
                    f"mig{scope.instance}" if scope.instance else "-"
                state.finding_id = f"{rule.id}:{scope.gpu_id}:{process}:{state.onset}"
                state.processes = state.true_processes
                if scope.process is not None and scope.process not in state.processes:
                    state.processes += (scope.process,)   # the main one joined since
                state.since = self._since(state.onset, now, state.processes)
            state.severity = severity
            return self._finding(rule, scope, state, now, "firing", *self._advice(rule, ev),
                                 override)
        state.true_since = None
        if state.status != "firing":
            state.status = "suppressed" if guarded is not None else "ok"
            state.detail = "guard holds" if guarded is not None else ""
            return None
        if rule.clear is not None and guarded is None:
            if truth(ev.value(rule.clear)) is not True:
                return None
        else:
            state.false_since = state.false_since if state.false_since is not None else now
            clear_after = rule.clear_after_ns if rule.clear_after_ns is not None else \
                max(2 * rule.for_ns, rule.every_ns or self.interval_ns)
            if now - state.false_since < clear_after:
                return None
        return self._clear_now(rule, scope, state, now, override)

    def _clear_now(self, rule: m.Rule, scope: Scope, state: InstanceState, now: int,
                   override: Override) -> RuleFinding | None:
        if state.status != "firing":
            return None
        finding = self._finding(rule, scope, state, now, "cleared", {}, [], override)
        state.status, state.finding_id, state.severity, state.onset = "ok", None, None, None
        state.false_since = state.true_since = state.since = None
        state.processes = state.true_processes = ()
        return finding

    def _named(self, rule: m.Rule, scope: Scope) -> tuple[ProcessKey, ...]:
        """The processes a finding names: a GPU rule's every compute process on the GPU (the
        round's list, monitors left out), a process rule's own process, none for an
        instance rule (which of the GPU's processes runs in the instance is not known)."""
        if rule.scope == "gpu":
            return tuple(self._procs.get(scope.gpu_id, ()))
        return (scope.process,) if scope.process is not None else ()

    def _since(self, onset: int, now: int, processes: tuple[ProcessKey, ...]) -> int:
        """When the condition first held (``onset``, an evaluation time: never before the
        samples it read), but never before a process the finding names was first seen
        (``first_seen``, realtime ns; a ProcessKey's start_time is in clock ticks since
        boot, not comparable): a process that joined later cannot date it earlier."""
        since = onset
        for process in processes:
            facts = self._facts[process] if process in self._facts else \
                self.signals.facts(process)
            if facts is not None and facts.first_seen is not None:
                since = max(since, facts.first_seen)
        return min(since, now)

    def _job_ended(self, rule: m.Rule, scope: Scope, now: int) -> str:
        """G-JOB-END, for a GPU rule that reads the GPU's activity (``requires`` names
        gpu.util or gpu.busy): the GPU has no compute process left, one that this engine saw
        on it exited with code 0 (no signal) within the rule's window, and none of its
        processes ended otherwise there (a non-zero code, a signal, or an end not known):
        the job ended cleanly, and the GPU's idle after it is no finding."""
        if rule.scope != "gpu" or not any(name in JOB_END_SIGNALS for name in rule.requires):
            return ""
        seen = self._seen_on.get(scope.gpu_id)
        if not seen or self._procs.get(scope.gpu_id):
            return ""
        clean = 0
        for ts, row in self.signals.events(scope, "proc.exit", now - rule.window_ns, now):
            if row.get("_process") not in seen:
                continue
            if row.get("exit_code") != 0 or row.get("signal"):
                return ""          # killed or failed: the symptoms stay findings
            clean = max(clean, ts)
        if not clean:
            return ""
        return f"G-JOB-END: the GPU's compute process exited with code 0 " \
               f"{(now - clean) / 1e9:.0f} s ago"

    def _warming(self, rule: m.Rule, ev: Evaluation, instance: dict, now: int) -> str:
        if not rule.warmup_ns:
            return ""
        age = instance.get("proc.age_s")
        if age is not None and age * 1e9 < rule.warmup_ns:
            return f"G-WARMUP: process started {age:.0f} s ago"
        for stream, where in (("gpu.state", BACK_STATES + RESET_STATES),
                              ("journal.nvrm", ("driver_loaded",))):
            for _, row in self.signals.events(ev.scope, stream, now - RESET_WARMUP_NS, now):
                if row.get("state", row.get("kind")) in where:
                    return f"G-WARMUP: GPU reset or driver load within {RESET_WARMUP_NS // 10**9} s"
        return ""

    def _missing_requirements(self, rule: m.Rule, ev: Evaluation,
                              facts: ProcessFacts | None) -> list[str]:
        missing = []
        for name in rule.requires:
            if name in SIGNALS:
                series = ev.series(name, rule.window_ns)
                if not ev._covered(name, series, rule.window_ns):
                    missing.append(name if series else f"{name} (no samples)")
                    if series:
                        missing[-1] = f"{name} (warming up)"
            elif name in FACTS:
                if self.signals.fact(ev.scope, name) is None:
                    missing.append(f"{name} (unknown GPU model)")
            elif name in PROCESS_TEXT and facts is None:
                missing.append(f"{name} (process unknown)")
        return missing

    def _severity(self, rule: m.Rule, ev: Evaluation, instance: dict) -> str:
        # The worst of the base and every escalation that holds, on the one scale (a Rule
        # built in code may still carry a legacy name: worst() maps it).
        severity = sev.worst([rule.severity] + [level for condition, level in rule.escalations
                                                if truth(ev.value(condition))])
        if rule.shared == "info" and instance.get("gpu.contexts", 0) >= 2:
            severity = "info"   # G-SHARED: device counters cannot be pinned on one process
        return severity

    def _advice(self, rule: m.Rule, ev: Evaluation) -> tuple[dict, list[str]]:
        ev.min_coverage = 0.0
        evidence = {name: _round(ev.value(node)) for name, node in rule.evidence}
        fixes = [fix.text for fix in rule.fixes
                 if fix.condition is None or truth(ev.value(fix.condition)) is True]
        return evidence, fixes

    def _finding(self, rule: m.Rule, scope: Scope, state: InstanceState, now: int, phase: str,
                 evidence: dict, fixes: list[str], override: Override) -> RuleFinding:
        onset = state.onset if state.onset is not None else now
        return RuleFinding(
            ts=now, finding_id=state.finding_id or f"{rule.id}:{scope.gpu_id}:-:{onset}",
            rule_id=rule.id, title=rule.title, severity=state.severity or rule.severity,
            state=phase, gpu_id=scope.gpu_id, process=scope.process,
            window_start=onset - rule.window_ns, window_end=now, evidence=evidence,
            root_cause=rule.cause, fixes=fixes, verify=rule.verify,
            shadow=override.shadow or self.shadow_all, group=rule.group,
            since=state.since if state.since is not None else onset,
            processes=list(state.processes), rule_kind=rule.kind,
            explains=list(rule.explains),
            unexplained=self._unexplained(rule, scope) if rule.kind == m.SYMPTOM else [],
            instance=scope.instance, mig_profile=state.mig_profile, scope=rule.scope)

    def _unexplained(self, symptom: m.Rule, scope: Scope) -> list[str]:
        """Why each cause rule that could explain ``symptom`` is not established here: what
        it lacks (a requirement, a warm-up, a guard) or that its condition does not hold."""
        out = []
        for cause in self.explained_by.get(symptom.id, []):
            states = [s for k, s in self.states.items()
                      if k[0] == cause.id and k[1] == scope.gpu_id and
                      (scope.process is None or k[2] in (None, scope.process)) and
                      k[3] in ("", scope.instance)]
            if any(s.status == "firing" for s in states):
                continue
            detail = next((s.detail for s in states if s.detail), "")
            out.append(f"{cause.id}: {detail or 'its condition does not hold'}")
        return out

    def status(self) -> list[dict]:
        """Every instance's last state, for ``rules test`` and the runner's health."""
        return [{"rule_id": k[0], "gpu_id": k[1], "process": str(s.process or ""),
                 "instance": k[3], "status": s.status, "detail": s.detail}
                for k, s in sorted(self.states.items(), key=lambda kv: (
                    kv[0][0], kv[0][1], str(kv[0][2]), mig_order(kv[0][3])))]
