"""`gpuwhy rules eval`: how often the answer a person reads is the right one.

Each scenario of a corpus is a capture (JSON lines of bus payloads, as `gpuwhy record`
writes them) and a manifest beside it (``NAME.json``: the planted cause, the rule ids that
are acceptable top answers, or none for a healthy host; gpuwhy.app.demo.corpus describes the
format). By default every capture is replayed through the live path on a private store
(gpuwhy.correlator.rules.live_replay: the real writer and decide stage, the shipped rules
over the store, as the service runs them), and after every round the answer is read with
the call `gpuwhy why` makes (gpuwhy.store.queries.gpu_verdicts); what leads the worst GPU's
answer is the top answer. ``--path engine`` replays through the rules engine alone, in
memory, ranking the findings still firing and the causes cleared lately with
gpuwhy.rules.answer.answers. A fault scenario is a hit when the top answer at the end is an
acceptable one; its time to answer is the capture second the right answer first led. A
healthy scenario raises a false alarm when any warning-or-worse finding fired at any time.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from gpuwhy.app.clitypes import InputDir
from gpuwhy.events import ProcessSeen, RuleFinding
from gpuwhy.rules.answer import answers

NS = 10**9
MANIFEST_FORMAT = "gpuwhy-scenario/1"
CLEARED_KEPT_NS = 3600 * NS    # the longest rule window: no symptom reaches further back


class Unreadable(Exception):
    """A corpus, manifest or capture that cannot be read (exit status 2)."""


@dataclass
class Case:
    name: str
    capture: Path
    healthy: bool
    expected: list[str]
    cause: str = ""
    seed: int | None = None
    group: str = ""
    onset_s: float = 0.0
    half: str = ""        # a split corpus's half ("tuning", "held-out"), "" when unsplit


@dataclass
class Outcome:
    case: Case
    top: str | None = None
    top_kind: str | None = None
    hit: bool = False
    first_led_s: float | None = None     # when an acceptable answer first led
    alarms: list[str] = field(default_factory=list)      # warning-or-worse rule ids
    fired: list[str] = field(default_factory=list)       # every rule id that fired
    timeline: list[tuple[float, str | None]] = field(default_factory=list)
    events: int = 0
    seconds: float = 0.0
    # False when every expected rule reads env() and no process of the capture carries an
    # environment (ProcessSeen.env: a capture made before the probes recorded it, or with
    # probes.environment empty), so such a fault is listed, not scored
    evaluable: bool = True

    @property
    def time_to_answer_s(self) -> float | None:
        """Capture seconds until the right answer first led, for a hit."""
        return self.first_led_s if self.hit else None

    @property
    def false_alarm(self) -> bool:
        return self.case.healthy and bool(self.alarms)

    def as_dict(self) -> dict:
        c = self.case
        return {"name": c.name, "seed": c.seed, "healthy": c.healthy, "cause": c.cause,
                "group": c.group, "half": c.half, "expected": c.expected, "top": self.top,
                "top_kind": self.top_kind,
                "result": ("alarm" if self.false_alarm else "ok") if c.healthy else
                ("not evaluable" if not self.evaluable else "hit" if self.hit else "miss"),
                "hit": None if c.healthy else self.hit, "false_alarm": self.false_alarm,
                "time_to_answer_s": self.time_to_answer_s, "first_led_s": self.first_led_s,
                "onset_s": c.onset_s,
                "after_onset_s": None if self.time_to_answer_s is None
                else max(0.0, self.time_to_answer_s - c.onset_s),
                "alarms": self.alarms, "fired": self.fired,
                "timeline": [{"t_s": t, "top": top} for t, top in self.timeline],
                "events": self.events, "replay_s": round(self.seconds, 2)}


# --- ranking ------------------------------------------------------------------------------
def ranking() -> tuple[str, Callable[[list, dict], list[tuple[object, str | None]]]]:
    """(how, rank): rank(open findings, rules by id) -> [(finding, kind)], best first: the
    answer's own ranking (gpuwhy/rules/answer.py), never one of the evaluation's."""
    def rank(findings: list, rules: dict) -> list[tuple[object, str | None]]:
        return [(a.finding, a.kind) for a in answers(findings, rules)]
    return "gpuwhy.rules.answer.answers", rank


# --- the corpus ---------------------------------------------------------------------------
def read_corpus(directory: Path) -> list[Case]:
    """The scenarios of a corpus folder: every ``*.json`` manifest and its capture."""
    if not directory.is_dir():
        raise Unreadable(f"{directory}: not a folder")
    cases = []
    for path in sorted(directory.glob("*.json")):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise Unreadable(f"{path}: not a manifest: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != MANIFEST_FORMAT:
            continue   # another JSON file in the folder
        try:
            expected = [str(r) for r in meta.get("expected", [])]
            healthy = bool(meta.get("healthy", not expected))
            name = str(meta.get("name") or path.stem)
            capture = path.parent / str(meta.get("capture") or f"{path.stem}.jsonl")
            case = Case(name, capture, healthy, expected, str(meta.get("cause", "")),
                        meta.get("seed"), str(meta.get("group", "")),
                        float(meta.get("onset_s") or 0.0), str(meta.get("half") or ""))
        except (TypeError, ValueError) as exc:
            raise Unreadable(f"{path}: bad manifest: {exc}") from None
        if not healthy and not expected:
            raise Unreadable(f"{path}: a fault scenario needs its expected rule ids")
        if not capture.is_file():
            raise Unreadable(f"{path}: capture {capture} missing")
        cases.append(case)
    if not cases:
        raise Unreadable(f"{directory}: no scenario manifests ({MANIFEST_FORMAT})")
    return cases


# --- one scenario -------------------------------------------------------------------------
LIVE, ENGINE = "live", "engine"
PATHS = (LIVE, ENGINE)


def evaluate_case(case: Case, rules: list, rank: Callable, every_ns: int = 10 * NS,
                  path: str = LIVE) -> Outcome:
    """Replay one capture and score its answers over time: through the live path (writer,
    decide stage, store, the rules over the store, the answer as `gpuwhy why` reads it), or
    through the engine alone with in-memory signals and ``rank`` (``path`` ``engine``)."""
    from gpuwhy import severity as sev
    from gpuwhy.app.rules_cli import read_capture, replay
    from gpuwhy.correlator.rules.live_replay import replay_live, top_of
    from gpuwhy.correlator.rules.runner import env_keys

    started = time.monotonic()
    try:
        events = read_capture(str(case.capture))
    except click.ClickException as exc:
        raise Unreadable(exc.message) from None
    if not events:
        raise Unreadable(f"{case.capture}: no events")
    by_id = {r.id: r for r in rules}
    out = Outcome(case, events=len(events))
    start = events[0].ts
    open_findings: dict[str, RuleFinding] = {}
    cleared: dict[str, RuleFinding] = {}   # lately cleared: a cause may still explain a symptom
    fired: set[str] = set()
    alarms: set[str] = set()
    current: list = [None, None]      # top rule id, its kind

    def observe(new: list) -> None:
        for f in new:
            if f.state == "firing":
                fired.add(f.rule_id)
                if not f.shadow and sev.rank(f.severity) >= sev.rank("warning"):
                    alarms.add(f.rule_id)

    def lead(now: int, top: str | None, kind: str | None) -> None:
        if not out.timeline or top != current[0]:
            out.timeline.append((round((now - start) / NS, 1), top))
        current[:] = [top, kind]
        if out.first_led_s is None and top in case.expected:
            out.first_led_s = round((now - start) / NS, 1)

    def engine_round(now: int, new: list) -> None:
        if not new and out.timeline:
            return
        observe(new)
        for f in new:
            if f.state == "firing":
                open_findings[f.finding_id] = f
                cleared.pop(f.finding_id, None)
            else:
                open_findings.pop(f.finding_id, None)
                cleared[f.finding_id] = f
        for finding_id in [k for k, f in cleared.items() if now - f.ts > CLEARED_KEPT_NS]:
            del cleared[finding_id]
        ranked = rank([*open_findings.values(), *cleared.values()], by_id)
        lead(now, *((ranked[0][0].rule_id, ranked[0][1]) if ranked else (None, None)))

    def live_round(now: int, new: list, answer: list) -> None:
        observe(new)
        top, kind, _ = top_of(answer)
        lead(now, top, kind)

    if path == LIVE:
        with tempfile.TemporaryDirectory(prefix="gpuwhy-eval-") as folder:
            replay_live(events, rules, every_ns, Path(folder), live_round)
    else:
        replay(events, rules, every_ns, engine_round)
    if not case.healthy and case.expected and all(
            r in by_id and env_keys([by_id[r]]) for r in case.expected) and not any(
            isinstance(e, ProcessSeen) and e.env for e in events):
        out.evaluable = False
    out.top, out.top_kind = current
    out.hit = not case.healthy and out.top in case.expected
    out.alarms, out.fired = sorted(alarms), sorted(fired)
    out.seconds = time.monotonic() - started
    return out


def summary(outcomes: list[Outcome], how: str, seconds: float) -> dict:
    faults = [o for o in outcomes if not o.case.healthy and o.evaluable]
    healthy = [o for o in outcomes if o.case.healthy]
    hits = [o for o in faults if o.hit]
    times = [o.time_to_answer_s for o in hits if o.time_to_answer_s is not None]
    return {"ranking": how, "scenarios": len(outcomes), "faults": len(faults),
            "hits": len(hits), "accuracy": round(len(hits) / len(faults), 3) if faults else None,
            "led_at_some_time": sum(o.first_led_s is not None for o in faults),
            "healthy": len(healthy), "false_alarms": sum(o.false_alarm for o in healthy),
            "false_alarm_rate": round(sum(o.false_alarm for o in healthy) / len(healthy), 3)
            if healthy else None,
            "median_time_to_answer_s": statistics.median(times) if times else None,
            "max_time_to_answer_s": max(times) if times else None,
            "not_evaluable": [o.case.name for o in outcomes
                              if not o.case.healthy and not o.evaluable],
            "elapsed_s": round(seconds, 1)}


def halves(outcomes: list[Outcome], how: str) -> dict[str, dict]:
    """The summary of each half of a split corpus (its manifests' ``half``), apart: a rule
    change is judged on the tuning half and only measured on the held-out one."""
    names = sorted({o.case.half for o in outcomes if o.case.half})
    return {name: summary([o for o in outcomes if o.case.half == name], how, 0.0)
            for name in names}


def _summary_line(total: dict) -> str:
    acc = f"{total['accuracy']:.2f}" if total["accuracy"] is not None else "-"
    med, top = total["median_time_to_answer_s"], total["max_time_to_answer_s"]
    return (f"{total['hits']}/{total['faults']} faults = {acc} (right answer led at some "
            f"time: {total['led_at_some_time']}); false alarms: {total['false_alarms']}/"
            f"{total['healthy']} healthy hosts; time to answer: "
            + (f"median {med:.0f} s, max {top:.0f} s" if med is not None else "-"))


def _short(rule_id: str | None) -> str:
    return "-" if rule_id is None else rule_id


def _line(o: Outcome) -> str:
    c = o.case
    expected = "(healthy)" if c.healthy else "|".join(r.split("_")[0] for r in c.expected)
    if c.healthy:
        result = "ALARM" if o.false_alarm else "ok"
        tail = ",".join(r.split("_")[0] for r in o.alarms) if o.alarms else ""
    else:
        result = "hit" if o.hit else "miss" if o.evaluable else "n/e"
        tail = f"+{o.first_led_s:.0f}s" if o.first_led_s is not None else ""
        if not o.evaluable:
            tail = "(reads env(): the capture's processes carry no environment)"
        elif not o.hit and tail:
            tail = f"(led at {tail}, not at the end)"
    half = f"  [{c.half}]" if c.half else ""
    return f"{c.name:<30} {expected:<10} {_short(o.top):<36} {result:<6} {tail}{half}"


# --- the command --------------------------------------------------------------------------
@click.command("eval")
@click.option("--corpus", "corpus_dir", type=InputDir(),
              help="A folder of captures and their NAME.json manifests (default: generate "
                   "the built-in corpus into a temporary folder).")
@click.option("--corpus-set", "corpus_set", type=click.Choice(("builtin", "outside")),
              default="builtin", show_default=True,
              help="Without --corpus: builtin, the corpus written beside the rules; outside, "
                   "hosts written from outside sources, split once into a tuning and a "
                   "held-out half, reported apart.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--only", multiple=True, metavar="NAME",
              help="Only these scenarios (repeat, or separate with commas).")
@click.option("--path", "path", type=click.Choice(PATHS), default=LIVE, show_default=True,
              help="live: each capture through the writer, decide stage and store, the "
                   "answer read as `gpuwhy why` reads it; engine: the rules engine alone, "
                   "in memory (faster; no health, no incidents).")
def evaluate(corpus_dir: str | None, corpus_set: str, as_json: bool, only: tuple[str, ...],
             path: str) -> None:
    """Replay a scenario corpus through the shipped rules and score the first answers.

    Per scenario: the expected cause(s), the top answer at the end, hit or miss, and the
    capture seconds until the right answer first led; then the accuracy on faults, false
    alarms on healthy hosts (any warning-or-worse finding) and the median and maximum time
    to answer. It is a measurement: the exit status is 0 whatever it finds, 2 when the
    corpus cannot be read.

    \b
    Examples:
      gpuwhy rules eval
      gpuwhy rules eval --only resnet18-cpu-starved,xid79-fallen-off-bus
      gpuwhy rules eval --corpus-set outside
      gpuwhy rules eval --corpus ./captures --json | jq .summary
    """
    from gpuwhy.rules.loader import load_rules

    names = [n for group in only for n in group.split(",") if n]
    started = time.monotonic()
    rules = load_rules()
    how, rank = ranking()
    if path == LIVE:
        how = "gpuwhy.rules.answer.verdicts over the store (the live path, as gpuwhy why)"
    with tempfile.TemporaryDirectory(prefix="gpuwhy-corpus-") as scratch:
        try:
            if corpus_dir is None:
                from gpuwhy.app.demo.corpus import write_corpus

                try:
                    write_corpus(Path(scratch), names, corpus_set)
                except KeyError as exc:
                    raise click.UsageError(f"no {corpus_set} scenario {exc.args[0]}") from None
                cases = read_corpus(Path(scratch))
            else:
                cases = read_corpus(Path(corpus_dir))
                if names:
                    unknown = sorted(set(names) - {c.name for c in cases})
                    if unknown:
                        raise click.UsageError(f"no scenario {', '.join(unknown)} in "
                                               f"{corpus_dir}")
                    cases = [c for c in cases if c.name in names]
            if not as_json:
                click.echo(f"ranking: {how}")
                click.echo(f"{'SCENARIO':<30} {'EXPECTED':<10} {'TOP ANSWER (END)':<36} "
                           f"{'RESULT':<6} TIME")
            outcomes = []
            for case in cases:
                outcome = evaluate_case(case, rules, rank, path=path)
                outcomes.append(outcome)
                if not as_json:
                    click.echo(_line(outcome))
        except Unreadable as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
    total = summary(outcomes, how, time.monotonic() - started)
    split = halves(outcomes, how)
    if as_json:
        click.echo(json.dumps({"summary": total, **({"halves": split} if split else {}),
                               "scenarios": [o.as_dict() for o in outcomes]}, indent=2))
        return
    misses = [o.case.name for o in outcomes
              if not o.case.healthy and o.evaluable and not o.hit]
    alarms = [o.case.name for o in outcomes if o.false_alarm]
    click.echo(f"accuracy: {_summary_line(total)} ({total['scenarios']} scenarios, "
               f"{total['elapsed_s']:.0f} s)")
    for name, part in split.items():
        click.echo(f"  {name}: {_summary_line(part)}")
    if misses:
        click.echo("missed: " + ", ".join(misses))
    if total["not_evaluable"]:
        click.echo("not evaluable (their rules read env(), their processes carry none): "
                   + ", ".join(total["not_evaluable"]))
    if alarms:
        click.echo("false alarms: " + ", ".join(alarms))
