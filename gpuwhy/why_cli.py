"""`gpuwhy why [GPU | PID-START]`: the one answer per GPU, worst first, from the service's store.

The answer is :func:`gpuwhy.store.queries.gpu_verdicts`: :func:`gpuwhy.rules.answer.verdicts`
over what the store holds (the findings firing, causes cleared lately, each GPU's health), the
same read `gpuwhy rules eval` scores on its replayed stores. Exit status: 0 when every GPU is
healthy (or answers only at info), 1 when an answer of warning or worse holds, 2 on a usage or
environment error (no store, an unknown GPU or process).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import click

from gpuwhy import severity as sev
from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import Answer, Verdict, ranks_lower, sentence, verdict_dict
from gpuwhy.text import format_ts, parse_ts, printable

HEALTHY, ANSWERED, UNUSABLE = 0, 1, 2


class Unanswerable(click.ClickException):
    """No store to read, or one this user cannot read: exit status 2, like a usage error."""

    exit_code = UNUSABLE


def service_rules(config: object) -> tuple[dict, list[str]]:
    """The rules the service runs, by id, and the problems of the rule files skipped (the
    one loading `gpuwhy why` and `gpuwhy mcp` share)."""
    from gpuwhy.rules.loader import load_rule_set

    paths = [p for p in config["rules.paths"].split(":") if p]
    loaded = load_rule_set(paths, builtin=config["rules.builtin"])
    return {r.id: r for r in loaded.rules}, [str(p) for p in loaded.problems]


def _rules(config: object) -> dict:
    """The rules the service runs, by id (a broken rule file is said on stderr, skipped)."""
    rules, problems = service_rules(config)
    for problem in problems:
        click.echo(f"warning: {problem} (rule skipped)", err=True)
    return rules


def _read(path: str, rules: dict, at: int | None) -> tuple[list[Verdict], object]:
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


def _about_process(answer: Answer, key: ProcessKey) -> bool:
    f = answer.finding
    return f.process == key or key in f.processes


def _exit_status(shown: list[Verdict]) -> int:
    worst = [v.severity for v in shown if v.severity]
    if worst and sev.rank(sev.worst(worst)) >= sev.rank("warning"):
        return ANSWERED
    return HEALTHY


def _print_detail(verdict: Verdict, key: ProcessKey | None, utc: bool) -> None:
    """The answer on one GPU, then its evidence, fix and check, then the others."""
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
                shown = "unknown" if value is None else value
                click.echo(f"    {printable(str(name))}: {printable(str(shown), 200)}")
        for i, fix in enumerate(f.fixes, 1):
            click.echo(f"  fix {i}      {printable(fix)}")
        if f.verify:
            click.echo(f"  verify     {printable(f.verify)}")
    others = [a for a in verdict.candidates if a is not lead
              and (key is None or _about_process(a, key))]
    if others and lead is not None:
        click.echo("  other candidates, ranked lower:")
        for answer in others:
            click.echo(f"    {answer.finding.rule_id} [{answer.finding.severity}] "
                       f"{printable(answer.finding.title)}: {ranks_lower(answer, lead)}")


@click.command()
@click.argument("target", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the answers as JSON.")
@click.option("--at", "at_text", metavar="TIME",
              help="The answer as it stood then (30m, 2h ago, or an ISO date-time).")
@click.option("--utc", is_flag=True, help="Times in UTC instead of local time.")
@click.pass_context
def why(ctx: click.Context, target: str | None, as_json: bool, at_text: str | None,
        utc: bool) -> None:
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
    """
    config = ctx.obj.config()
    at = None
    if at_text:
        try:
            at = parse_ts(at_text, now_ns())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--at") from None
    rules = _rules(config)
    shown, db = _read(config["store.path"], rules, at)
    try:
        key = None
        if target:
            shown, key = _select(db, shown, target)
    finally:
        db.close()
    if as_json:
        click.echo(json.dumps({"at": at, "verdicts": [verdict_dict(v) for v in shown]},
                              indent=2, default=str))
    elif target:
        for verdict in shown:
            _print_detail(verdict, key, utc)
    elif not shown:
        click.echo("no GPU known yet (the store has none)")
    elif all(v.healthy for v in shown):
        click.echo(f"all {len(shown)} GPU{'s' if len(shown) != 1 else ''} healthy")
    else:
        for verdict in shown:
            click.echo(printable(sentence(verdict, utc=utc)))
    ctx.exit(_exit_status(shown))


class NotNamed(GpuwhyError):
    """The target names no GPU or process the answers know (the message lists the GPUs)."""


def select_verdicts(db: object, shown: list[Verdict], target: str
                    ) -> tuple[list[Verdict], ProcessKey | None]:
    """The verdicts ``target`` names: one GPU, or each GPU a process's findings are on
    (shared by `gpuwhy why TARGET` and `gpuwhy mcp`'s ``why``). Raises :class:`NotNamed`."""
    from gpuwhy.store.queries import gpu_named, gpu_of_process

    try:
        key = ProcessKey.parse(target)
    except ValueError:
        key = None
    if key is not None:
        mine = [v for v in shown if any(_about_process(a, key) for a in v.candidates)]
        if not mine:
            gpu = gpu_of_process(db, key)
            mine = [v for v in shown if v.gpu.gpu_id == gpu]
        if not mine:
            raise NotNamed(f"no GPU answer names process {key} (not seen on a GPU)")
        return mine, key
    gpu_id = gpu_named(db, target)
    mine = [v for v in shown if v.gpu.gpu_id == gpu_id]
    if not mine:
        known = ", ".join(v.gpu.label for v in shown) or "none"
        raise NotNamed(f"no GPU known as {printable(target, 80)} (known: {known})")
    return mine, None


def _select(db: object, shown: list[Verdict], target: str
            ) -> tuple[list[Verdict], ProcessKey | None]:
    try:
        return select_verdicts(db, shown, target)
    except NotNamed as exc:
        raise Unanswerable(str(exc)) from None
