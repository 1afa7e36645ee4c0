"""`gpuwhy why [GPU | PID-START]`: the one answer per GPU, worst first, from the service's store.

The answer is :func:`gpuwhy.store.queries.gpu_verdicts`: :func:`gpuwhy.rules.answer.verdicts`
over what the store holds (the findings firing, causes cleared lately, each GPU's health), the
same read `gpuwhy rules eval` scores on its replayed stores. Exit status: 0 when every GPU is
healthy (or answers only at info), 1 when an answer of warning or worse holds, 2 on a usage or
environment error (no store, an unknown GPU or process).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
from collections.abc import Generator, Mapping
from pathlib import Path

import click
from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.app.verdicts import (
    NotNamed,
    ServiceRules,
    about_process,
    select_verdicts,
)
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.errors import GpuwhyError
from gpuwhy.identity import ProcessKey
from gpuwhy.quantities import compact, label, quantity
from gpuwhy.rules.answer import Verdict, ranks_lower, sentence, verdict_dict
from gpuwhy.rules.model import Rule
from gpuwhy.text import format_ts, parse_ts, printable

HEALTHY, ANSWERED, UNUSABLE = 0, 1, 2


class Unanswerable(click.ClickException):
    """No store to read, or one this user cannot read: exit status 2, like a usage error."""

    exit_code = UNUSABLE


def _read(path: str, rules: Mapping[str, Rule], at: int | None
          ) -> tuple[list[Verdict], Database]:
    """(the answer on every GPU, the open store) at the moment ``at`` (now: None)."""
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import gpu_verdicts

    if not Path(path).exists():
        raise Unanswerable(
            f"no gpuwhy store at {path}: is the service running? Start it with "
            "`gpuwhy up` (or `systemctl start gpuwhy`), or name its store with --config")
    try:
        db = open_store(path, readonly=True)
        return gpu_verdicts(db, rules, at), db
    except GpuwhyError as exc:
        raise Unanswerable(str(exc)) from None
    except sqlite3.Error as exc:
        raise Unanswerable(f"cannot read the store {path}: {exc} (run as the user "
                                "gpuwhy runs as, e.g. with sudo)") from None


def _exit_status(shown: list[Verdict]) -> int:
    worst = [v.severity for v in shown if v.severity]
    if worst and sev.rank(sev.worst(worst)) >= sev.rank("warning"):
        return ANSWERED
    return HEALTHY


def _stack_lines(rows: list[dict]) -> list[str]:
    """Where the sampled processes spent their time (the stack sampler's aggregates of the
    lead answer), under the answer: per process, each role's top frames with their shares."""
    from gpuwhy.pystacks import ROLE_WORDS, split_by_gpu, summary_line

    lines = []
    for row in rows:
        head = (f"  stacks     process {row['pid']}-{row['start_time']}: {row['samples']} "
                f"samples every {row['interval_ms']} ms")
        if row["error"]:
            lines.append(f"{head}: {printable(row['error'], 200)}")
            continue
        lines.append(head + ("" if row["final"] else " (still sampling)"))
        for role, found in row["top"].items():
            shares = "; ".join(f"{round(share * 100)} % in {printable(frame, 160)}"
                               for frame, share in found)
            lines.append(f"    {ROLE_WORDS[role]}: {shares}")
        # the same samples lined up with the GPU's seconds: the contrast shows
        split = split_by_gpu(row["stacks"], row.get("gpu_idle") or {})
        for name, words in (("idle", "while the GPU sat idle"), ("busy", "while it was busy")):
            if said := summary_line(split[name]):
                lines.append(f"    {words}: {printable(said, 400)}")
    return lines


def _print_detail(verdict: Verdict, key: ProcessKey | None, utc: bool,
                  stacks: list[dict] | None = None) -> None:
    """The answer on one GPU, then its evidence, fix and check, where its processes spent
    their time (sampled Python stacks), then the others."""
    click.echo(printable(sentence(verdict, utc=utc)))
    gpu = verdict.gpu
    if gpu.health != "ok":
        click.echo(f"  health     {gpu.health} since {format_ts(gpu.health_since, 's', utc=utc)}"
                   + (f" ({printable(gpu.health_cause)})" if gpu.health_cause else ""))
        if gpu.health_clears:
            click.echo(f"  clears on  {printable(gpu.health_clears)}")
    lead = verdict.lead
    if lead is not None:
        f = lead.finding
        click.echo(f"  rule       {f.rule_id} ({lead.kind}, {f.severity})")
        if f.root_cause:
            click.echo(f"  why        {printable(f.root_cause)}")
        if lead.missing:
            click.echo("  missing    " + "; ".join(printable(m) for m in lead.missing))
        if f.evidence:
            click.echo("  evidence")
            for name, value in sorted(f.evidence.items()):
                click.echo(f"    {printable(label(str(name), value))}: "
                           f"{printable(_measured(str(name), value), 200)}")
        for i, fix in enumerate(f.fixes, 1):
            click.echo(f"  fix {i}      {printable(fix)}")
        if stacks:     # the fix, naming the line the sampled stacks point at
            from gpuwhy.stack_advice import sentences

            for said in sentences([s for row in stacks for s in row["stacks"]], f.rule_id):
                click.echo(f"  in code    {printable(said, 400)}")
        if f.verify:
            click.echo(f"  verify     {printable(f.verify)}")
        for line in _stack_lines(stacks or []):
            click.echo(line)
    others = [a for a in verdict.candidates if a is not lead
              and (key is None or about_process(a, key))]
    if others and lead is not None:
        click.echo("  other candidates, ranked lower:")
        for answer in others:
            click.echo(f"    {answer.finding.rule_id} [{answer.finding.severity}] "
                       f"{printable(answer.finding.title)}: {ranks_lower(answer, lead)}")


def _watch(config: Config, rules: Mapping[str, Rule], duration: float
           ) -> Generator[tuple[list[Verdict], Database, int], None, None]:
    """With no service: watch the host ``duration`` s through a private pipeline (root),
    then answer from the watch's store with the rules fitted to it; (the answer, the
    watch's store, ns watched)."""
    from gpuwhy.app.checks.watch import Target, Watch
    from gpuwhy.correlator.rules.short_watch import evaluate_watch
    from gpuwhy.rules.answer import verdicts
    from gpuwhy.store.queries import answer_gpus

    with Watch(config, Target(), duration, source="standalone", progress=sys.stderr) as watch:
        watched = watch.run()
        with contextlib.closing(watch.reader()) as db:
            findings = evaluate_watch(db, list(rules.values()), watched.start, watched.end)
            yield (verdicts(answer_gpus(db, watched.end), findings, rules), db,
                   watched.end - watched.start)


def _from_store(path: str, rules: Mapping[str, Rule], at: int | None
                ) -> Generator[tuple[list[Verdict], Database, int | None], None, None]:
    shown, db = _read(path, rules, at)
    try:
        yield shown, db, None
    finally:
        db.close()


def _sure(verdict: Verdict, rules: Mapping[str, Rule], watched_ns: int) -> float | None:
    """How much of what the lead's rule reads a short watch covered (None: not a watch)."""
    from gpuwhy.correlator.rules.short_watch import sureness

    if verdict.lead is None:
        return None
    return round(sureness(rules.get(verdict.lead.rule_id), watched_ns), 2)


def _sure_words(sure: float) -> str:
    word = "sure" if sure >= 0.9 else "probably" if sure >= 0.5 else "possibly"
    return f"{word}, {sure:.0%} of what its rule reads"


def _stacks_of(db: Database, shown: list[Verdict]) -> dict[str, list[dict]]:
    """The stored Python stacks of each shown GPU's lead answer, by GPU."""
    from gpuwhy.store.stacks import gpu_idle_by_second, python_stacks

    found = {v.gpu.gpu_id: python_stacks(db, finding_id=v.lead.finding.finding_id,
                                         gpu_id=v.gpu.gpu_id, limit=8)
             for v in shown if v.lead is not None}
    for rows in found.values():
        for row in rows:    # what the GPU did in each second the stacks were sampled
            row["gpu_idle"] = gpu_idle_by_second(db, row["gpu_id"], row["started"], row["ts"])
    return found


@click.command()
@click.argument("target", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the answers as JSON.")
@click.option("--at", "at_text", metavar="TIME",
              help="The answer as it stood then (30m, 2h ago, or an ISO date-time).")
@click.option("--duration", type=click.FloatRange(5, 3600), metavar="SECONDS",
              help="With no service running (as root): watch the host this long with the "
                   "probes and sources, then answer from what was seen, each answer saying "
                   "how much of its rule's window the watch covered. With a service, its "
                   "store answers.")
@click.option("--utc", is_flag=True, help="Times in UTC instead of local time.")
@click.pass_context
def why(ctx: click.Context, target: str | None, as_json: bool, at_text: str | None,
        duration: float | None, utc: bool) -> None:
    """Why each GPU is not busier, or what broke it: one answer per GPU, worst first.

    TARGET: a GPU (index, UUID, PCI address or id) or a process (PID-STARTTIME, as
    `gpuwhy proc` and the web view show it) for its answer in full: the evidence, the
    fix and how to check it, then the other candidates and why each ranks lower.

    \b
    Exit status: 0 all healthy; 1 an answer of warning or worse; 2 usage or
    environment error (no store, unknown GPU or process).
    \b
    Examples:
      gpuwhy why
      gpuwhy why 2
      gpuwhy why 0000:38:00.0 --json
      gpuwhy why 4242-1234567
      gpuwhy why --at 2026-12-03T02:00
      sudo gpuwhy why --duration 30     # no service: watch 30 s, then answer
    """
    from gpuwhy.app.checks.watch import EnvironmentProblem, service_running

    config = ctx.obj.config()
    at = None
    if at_text:
        if duration is not None:
            raise click.UsageError("--at reads the service's store; --duration watches now")
        try:
            at = parse_ts(at_text, now_ns())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--at") from None
    rules = ServiceRules(config)
    watch = duration is not None and not service_running(config)
    source = _watch(config, rules, duration) if watch and duration is not None \
        else _from_store(config["store.path"], rules, at)
    stacks: dict[str, list[dict]] = {}
    try:
        shown, db, watched_ns = next(source)
        key = None
        if target:
            shown, key = _select(db, shown, target)
            stacks = _stacks_of(db, shown)
    except EnvironmentProblem as exc:
        raise Unanswerable(exc.message) from None
    finally:
        source.close()
    sure = {id(v): _sure(v, rules, watched_ns) for v in shown} if watched_ns else {}
    watched_s = (watched_ns or 0) / 1e9     # said only beside a sureness: watched_ns is set
    if as_json:
        click.echo(json.dumps({"at": at, "watched_s": watched_ns / 1e9 if watched_ns else None,
                               "verdicts": [{**verdict_dict(v), "sureness": sure.get(id(v))}
                                            for v in shown]}, indent=2, default=str))
    elif target:
        for verdict in shown:
            _print_detail(verdict, key, utc, stacks.get(verdict.gpu.gpu_id))
            if (sureness := sure.get(id(verdict))) is not None:
                click.echo(f"  watched    {watched_s:.0f} s: {_sure_words(sureness)}")
    elif not shown:
        click.echo("no GPU known yet (the store has none)")
    elif all(v.healthy for v in shown):
        click.echo(f"all {len(shown)} GPU{'s' if len(shown) != 1 else ''} healthy"
                   + (f" (watched {watched_ns / 1e9:.0f} s)" if watched_ns else ""))
    else:
        for verdict in shown:
            line = sentence(verdict, utc=utc)
            if (sureness := sure.get(id(verdict))) is not None:
                line += f" ({_sure_words(sureness)}, watched {watched_s:.0f} s)"
            click.echo(printable(line))
    ctx.exit(_exit_status(shown))


def _measured(name: str, value: object) -> str:
    """A measured value in its unit (``0.973`` as kv_cache_usage: "97%"), as the web view
    writes it; "unknown" where the rule had no samples of it."""
    if value is None:
        return "unknown"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return quantity(name, value)
    return compact(value)


def _select(db: Database, shown: list[Verdict], target: str
            ) -> tuple[list[Verdict], ProcessKey | None]:
    try:
        return select_verdicts(db, shown, target)
    except NotNamed as exc:
        raise Unanswerable(str(exc)) from None
