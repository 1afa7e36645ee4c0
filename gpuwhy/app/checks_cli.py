"""`gpuwhy check` and `gpuwhy baseline`: watch a run and judge it, for CI pipelines.

Exit status: 0 every expectation holds (no figure regressed), 1 one does not, 2 usage or
environment errors (click's own usage errors are 2 as well).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import click

from gpuwhy.app.checks import baseline as baselines
from gpuwhy.app.checks.environment import environment
from gpuwhy.app.checks.expectations import evaluate, parse
from gpuwhy.app.checks.output import results_table, table, write_junit
from gpuwhy.app.checks.watch import EnvironmentProblem, Target, Watch, Watched, printable
from gpuwhy.app.clitypes import OutputFile
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.rules.parser import RuleSyntaxError

if TYPE_CHECKING:
    from sqlite_utils import Database

    from gpuwhy.correlator.rules.signals import Signals

T = TypeVar("T")
SOURCES = ("auto", "service", "standalone")


def _target(pid: int | None, cmd: str | None, argv: tuple[str, ...], gpu: str | None,
            need_process: bool = False) -> Target:
    import shlex

    if cmd and argv:
        raise click.UsageError("give the command either with --cmd or after --, not both")
    command = tuple(shlex.split(cmd)) if cmd else tuple(argv)
    if pid is not None and command:
        raise click.UsageError("--pid and a command exclude each other")
    if pid is None and not command and (need_process or not gpu):
        raise click.UsageError("say what to watch: --pid PID, --cmd 'COMMAND' or -- COMMAND"
                               + ("" if need_process else ", or --gpu ID"))
    return Target(pid, command, gpu)


def watch_options(func):  # noqa: ANN001, ANN201
    for option in reversed((
        click.option("--pid", type=int, help="Watch this running process."),
        click.option("--cmd", help="Run this command and watch it (or give it after --)."),
        click.option("--gpu", help="The GPU (id, UUID, PCI address or index); default: the "
                                   "one the process uses."),
        click.option("--duration", type=click.FloatRange(min=0.5), default=60.0,
                     show_default=True, help="Seconds to watch (less if the process exits)."),
        click.option("--source", type=click.Choice(SOURCES), default="auto", show_default=True,
                     help="Read the running service's store, or start the probes and "
                          "sources here (standalone, needs root); auto: the service if it "
                          "runs."),
        click.argument("argv", nargs=-1, type=click.UNPROCESSED),
    )):
        func = option(func)
    return func


def run_watch(ctx: click.Context, target: Target, duration: float, source: str,
              judge: Callable[[Watched], T]) -> T:
    """Watch, then call ``judge(watched)`` while the watch's store is still open."""
    config = ctx.obj.config()
    try:
        with Watch(config, target, duration, source, progress=sys.stderr) as watch:
            return judge(watch.run())
    except GpuwhyError as exc:
        raise EnvironmentProblem(str(exc)) from None


@click.command()
@click.option("--expect", "expectations", multiple=True, required=True,
              help="An expectation in the rules DSL, e.g. 'mean(sm_active) >= 0.6' "
                   "(repeatable).")
@watch_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--junit", type=OutputFile(),
              help="Write a JUnit XML report here.")
@click.pass_context
def check(ctx: click.Context, expectations: tuple[str, ...], pid: int | None, cmd: str | None,
          gpu: str | None, duration: float, source: str, argv: tuple[str, ...], as_json: bool,
          junit: str | None) -> None:
    """Watch a process or command, then test expectations about what the GPU and it did.

    Expectations use the rules DSL (`gpuwhy rules signals` lists the names); an aggregate
    without a window covers the whole watch, and short names work: sm_active, copy_util,
    gpu_util, power, temp, cpu_cores; count(xid) counts Xids. Exit status 0 when every
    expectation holds, 1 when one fails (or has no data), 2 on usage or environment errors.
    Progress and the command's own output go to stderr; stdout holds only the verdict.

    \b
    Examples:
      gpuwhy check --duration 300 --expect 'mean(sm_active) >= 0.6' \\
          --expect 'p95(copy_util) <= 0.8' --expect 'count(xid) == 0' -- python train.py
      gpuwhy check --pid 4242 --duration 60 --expect 'mean(proc.sleep_frac) < 0.5' --json
      gpuwhy check --gpu 0 --duration 30 --expect 'max(temp) < 85' --junit gpu.xml
    """
    target = _target(pid, cmd, argv, gpu)
    for text in expectations:
        try:
            parse(text)
        except RuleSyntaxError as exc:
            raise click.UsageError(f"--expect {text!r}: column {exc.column}: "
                                   f"{exc.message}") from None
    started = time.monotonic()

    def judge(watched: Watched) -> tuple[Watched, list]:
        return watched, evaluate(list(expectations), cast("Signals", watched.signals),
                                 watched.scope, watched.start, watched.end)

    watched, results = run_watch(ctx, target, duration, source, judge)
    passed = all(r.passed for r in results)
    if junit:
        write_junit(junit, "gpuwhy check",
                    [(r.expectation, r.passed, f"observed {r.observed}"
                      + (f"; missing: {', '.join(r.missing)}" if r.missing else ""))
                     for r in results], time.monotonic() - started)
    if as_json:
        click.echo(json.dumps({"passed": passed, "watched": watched.describe(),
                               "expectations": [r.as_dict() for r in results]}, indent=2))
    else:
        click.echo(f"watched {target.describe()} for "
                   f"{(watched.end - watched.start) / NS_PER_SECOND:.1f}s on GPU "
                   f"{watched.gpu_id or '?'} ({watched.mode})")
        click.echo(results_table(results))
        click.echo("all expectations hold" if passed else "expectations FAILED")
    ctx.exit(0 if passed else 1)


@click.group()
def baseline() -> None:
    """Capture a run's figures as a named baseline; compare later runs against it.

    \b
    Examples:
      gpuwhy baseline capture resnet --duration 120 -- python train.py
      gpuwhy baseline compare resnet --duration 120 --threshold 0.1 -- python train.py
      gpuwhy baseline list
    """


def _store(ctx: click.Context):  # noqa: ANN202
    from gpuwhy.store import open_store

    try:
        return open_store(ctx.obj.config()["store.path"])
    except GpuwhyError as exc:
        raise EnvironmentProblem(str(exc)) from None


def _figures(watched: Watched) -> dict:
    # a watch that has run: signals and db are set (open while it is judged)
    return {"figures": baselines.capture(cast("Signals", watched.signals), watched.scope,
                                         watched.start, watched.end),
            "environment": environment(cast("Database", watched.db), watched.gpu_id,
                                       watched.process,
                                       watched.libraries),
            "watched": watched.describe()}


@baseline.command()
@click.argument("name")
@watch_options
@click.option("--json", "as_json", is_flag=True, help="Print the captured figures as JSON.")
@click.pass_context
def capture(ctx: click.Context, name: str, pid: int | None, cmd: str | None, gpu: str | None,
            duration: float, source: str, argv: tuple[str, ...], as_json: bool) -> None:
    """Watch a run and keep its figures as baseline NAME (replacing one of that name).

    \b
    Example:
      gpuwhy baseline capture resnet --duration 120 -- python train.py
    """
    target = _target(pid, cmd, argv, gpu, need_process=False)
    captured = run_watch(ctx, target, duration, source, _figures)
    if not captured["figures"]:
        raise EnvironmentProblem("no figures: nothing was recorded for what was watched")
    record = {"created_at": now_ns(), "seconds": captured["watched"]["seconds"],
              "target": target.describe(), "gpu_id": captured["watched"]["gpu"], **captured}
    with contextlib.closing(_store(ctx)) as db:
        baselines.save(db, name, record)
    if as_json:
        click.echo(json.dumps({"name": name, **record}, indent=2))
        return
    click.echo(f"baseline {name!r}: {len(captured['figures'])} figures over "
               f"{record['seconds']}s of {target.describe()}")


@baseline.command()
@click.argument("name")
@watch_options
@click.option("--threshold", type=click.FloatRange(min=0.0),
              help="Relative change that counts as a regression [checks.threshold].")
@click.option("--all", "show_all", is_flag=True, help="Show every figure, not only the flagged.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--junit", type=OutputFile(),
              help="Write a JUnit XML report here.")
@click.pass_context
def compare(ctx: click.Context, name: str, pid: int | None, cmd: str | None, gpu: str | None,
            duration: float, source: str, argv: tuple[str, ...], threshold: float | None,
            show_all: bool, as_json: bool, junit: str | None) -> None:
    """Watch a run and flag every figure that moved past the threshold in its bad direction
    against baseline NAME. Exit status 1 when one did.

    \b
    Example:
      gpuwhy baseline compare resnet --duration 120 --threshold 0.1 -- python train.py
    """
    target = _target(pid, cmd, argv, gpu)
    threshold = ctx.obj.config()["checks.threshold"] if threshold is None else threshold
    with contextlib.closing(_store(ctx)) as db:
        before = baselines.load(db, name)
    if before is None:
        raise EnvironmentProblem(f"no baseline named {name!r} (`gpuwhy baseline list`)")
    started = time.monotonic()
    now = run_watch(ctx, target, duration, source, _figures)
    changes = baselines.compare(before["figures"], now["figures"], threshold)
    flagged = [c for c in changes if c.flagged]
    if junit:
        write_junit(junit, f"gpuwhy baseline {name}",
                    [(f"{c.figure} {c.stat}", not c.flagged,
                      f"{c.before:.4g} -> {c.after}: {c.change:+.0%}" if c.after is not None
                      else "gone") for c in changes if c.direction],
                    time.monotonic() - started)
    if as_json:
        click.echo(json.dumps({"baseline": name, "threshold": threshold,
                               "regressed": bool(flagged),
                               "environment": {"baseline": before["environment"],
                                               "now": now["environment"]},
                               "changes": [c.as_dict() for c in changes]}, indent=2))
    else:
        shown = changes if show_all else flagged
        click.echo(f"compared {target.describe()} with baseline {name!r} "
                   f"(threshold {threshold:.0%})")
        _environment_changes(before["environment"], now["environment"])
        if shown:
            click.echo(table(("figure", "stat", "baseline", "now", "change", "good", "flag"),
                             [(c.figure, c.stat, c.before, c.after,
                               "-" if c.change is None else f"{c.change:+.1%}",
                               c.direction or "", "REGRESSED" if c.flagged else "")
                              for c in shown]))
        click.echo(f"{len(flagged)} figure(s) regressed" if flagged else "no regression")
    ctx.exit(1 if flagged else 0)


def _environment_changes(before: dict, now: dict) -> None:
    for key in sorted(set(before) | set(now)):
        if key in ("cmdline", "comm") or before.get(key) == now.get(key):
            continue
        click.echo(f"  environment {key}: {printable(str(before.get(key)))} -> "
                   f"{printable(str(now.get(key)))}")


@baseline.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """The baselines kept in the store."""
    from gpuwhy.text import format_ts as when

    with contextlib.closing(_store(ctx)) as db:
        rows = baselines.listing(db)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo("no baselines")
    else:
        click.echo(table(("name", "captured", "seconds", "GPU", "watched"),
                         [(printable(r["name"], 40), when(r["created_at"]), r["seconds"],
                           r["gpu_id"], printable(r["target"] or "")) for r in rows]))


@baseline.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """One baseline: its environment and figures."""
    with contextlib.closing(_store(ctx)) as db:
        row = baselines.load(db, name)
    if row is None:
        raise EnvironmentProblem(f"no baseline named {name!r}")
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    click.echo(f"baseline {printable(name)}: {row['seconds']}s of "
               f"{printable(row['target'] or '')}")
    for key, value in sorted(row["environment"].items()):
        click.echo(f"  {key}: {printable(str(value))}")
    click.echo(table(("figure", "unit", "p5", "p50", "p95", "mean / rate"),
                     [(f, baselines.unit(f), s.get("p5"), s.get("p50"), s.get("p95"),
                       s.get("mean", s.get("value"))) for f, s in row["figures"].items()]))


@baseline.command()
@click.argument("name")
@click.pass_context
def delete(ctx: click.Context, name: str) -> None:
    """Delete baseline NAME."""
    with contextlib.closing(_store(ctx)) as db:
        if not baselines.delete(db, name):
            raise EnvironmentProblem(f"no baseline named {name!r}")
    click.echo(f"deleted baseline {name!r}")
