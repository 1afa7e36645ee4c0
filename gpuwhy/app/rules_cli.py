"""`gpuwhy rules …` (list, show, lint, set, test, signals) and `gpuwhy record` (bus captures)."""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuwhy.app.clitypes import InputFile, OutputFile
from gpuwhy.errors import DecodeError, GpuwhyError
from gpuwhy.rules import model as m
from gpuwhy.text import table

if TYPE_CHECKING:
    from gpuwhy.correlator.rules.engine import Engine

NS = 10**9


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(exc))


def _rules(obj: Any, extra: tuple[str, ...] = ()) -> list[m.Rule]:
    """The rules the service runs: a broken rule file is named on stderr and skipped, as the
    service skips it."""
    from gpuwhy.rules.loader import load_rule_set

    config = obj.config()
    paths = [p for p in config["rules.paths"].split(":") if p] + list(extra)
    loaded = load_rule_set(paths, builtin=config["rules.builtin"])
    for problem in loaded.problems:
        click.echo(f"warning: {problem} (rule skipped)", err=True)
    return loaded.rules


def _overrides(obj: Any) -> dict:
    from gpuwhy.store import open_store
    from gpuwhy.store.overrides import read_overrides

    path = obj.config()["store.path"]
    if not Path(path).exists():
        return {}
    try:
        db = open_store(path, readonly=True)
    except GpuwhyError:
        return {}
    try:
        return read_overrides(db)
    finally:
        db.close()


def _find(rules: list[m.Rule], rule_id: str) -> m.Rule:
    for rule in rules:
        if rule.id == rule_id or rule.id.split("_")[0] == rule_id:
            return rule
    raise click.ClickException(f"no rule {rule_id!r} (see `gpuwhy rules list`)")


@click.group()
def rules() -> None:
    """Expert rules: list, inspect, lint, tune and test them.

    Rules are files in a small language (docs/rules.md); the shipped ones live in the
    package, more come from the rules.paths setting. Overrides (enabled, shadow,
    thresholds) are kept in the store and read by the running service every round.

    \b
    Examples:
      gpuwhy rules list
      gpuwhy rules show R19
      gpuwhy rules lint my.rules
      gpuwhy rules set R14_bursty_utilisation enabled=false
      gpuwhy rules set R01 threshold busy_util=0.7 worker_busy=0.8
      gpuwhy rules test my.rules --builtin --replay capture.jsonl
    """


@rules.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--markdown", is_flag=True, help="Print the table of docs/rules.md.")
@click.pass_obj
def list_rules(obj: Any, as_json: bool, markdown: bool) -> None:
    """Every rule: id, group, kind, scope, severity, state of its override, title.

    \b
    Examples:
      gpuwhy rules list
      gpuwhy rules list --json | jq '.[] | select(.enabled == false)'
    """
    loaded = _rules(obj)
    if markdown:
        from gpuwhy.rules.docs import rules_markdown

        click.echo(rules_markdown(loaded), nl=False)
        return
    overrides = _overrides(obj)
    rows: list[dict[str, Any]] = []
    for r in loaded:
        o = overrides.get(r.id)
        rows.append({"id": r.id, "group": r.group, "kind": r.kind,
                     "explains": list(r.explains), "scope": r.scope, "severity": r.severity,
                     "enabled": o.enabled if o else True, "shadow": o.shadow if o else False,
                     "params": {**r.params, **(dict(o.params) if o else {})},
                     "title": r.title, "file": r.location})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(table(
        ["rule", "group", "kind", "scope", "severity", "title"],
        [[row["id"], row["group"], row["kind"], row["scope"], row["severity"],
          row["title"] + ("" if row["enabled"] else " [disabled]")
          + (" [shadow]" if row["shadow"] else "")] for row in rows]))
    click.echo(f"{len(rows)} rules")


@rules.command()
@click.argument("rule_id")
@click.pass_obj
def show(obj: Any, rule_id: str) -> None:
    """A rule's text, where it comes from, and the overrides in effect.

    \b
    Examples:
      gpuwhy rules show R19_power_cap
      gpuwhy rules show R19          # by its number
    """
    rule = _find(_rules(obj), rule_id)
    override = _overrides(obj).get(rule.id)
    click.echo(f"# {rule.location}")
    if not rule.kind_declared:
        click.echo(f"# kind: {rule.kind} (no 'kind:' given)")
    if override is not None:
        click.echo(f"# override: enabled={str(override.enabled).lower()} "
                   f"shadow={str(override.shadow).lower()} thresholds="
                   + (" ".join(f"{k}={v:g}" for k, v in override.params.items()) or "-"))
    click.echo(rule.text)


@rules.command()
@click.argument("files", nargs=-1, required=True, type=InputFile(dir_okay=True))
@click.option("--strict", is_flag=True,
              help="Hold the files to the shipped rules' standard: 'kind:' required.")
def lint(files: tuple[str, ...], strict: bool) -> None:
    """Check rule files: syntax, names, that every rule gives advice, and that each
    'explains:' names a symptom rule (shipped or in the files).

    A rule without 'kind:' is read as a cause: a note for an operator's file, a problem for
    a shipped one (and with --strict). Exit status 1 when any file has a problem.

    \b
    Examples:
      gpuwhy rules lint /etc/gpuwhy/rules/*.rules
      gpuwhy rules lint --strict my.rules
    """
    from gpuwhy.rules.loader import load_rule_set

    # All files at once: a rule id given in two of them is a problem, as in the service.
    # Every file is reported, the broken ones with each problem's line.
    loaded = load_rule_set(list(files), builtin=False)
    known = {r.id: r for r in load_rule_set(builtin=True).rules}
    for rule in loaded.rules:
        known.setdefault(rule.id, rule)
    bad = 0
    for file in loaded.files:
        shipped = strict or is_shipped(file.path)
        problems = [str(p) for p in file.problems] + \
            [problem for rule in file.rules for problem in lint_rule(rule, known, shipped)]
        for problem in problems:
            click.echo(problem, err=True)
        for rule in file.rules:
            if not shipped and not rule.kind_declared:
                click.echo(f"{rule.location}: rule {rule.id}: note: no 'kind:', read as "
                           f"kind: {m.CAUSE}", err=True)
        bad += bool(problems)
        if not problems:
            click.echo(f"{file.path}: {len(file.rules)} rules OK")
        elif file.problems:
            click.echo(f"{file.path}: {len(file.rules)} rules loaded, {len(file.problems)} "
                       f"broken (not loaded)")
    for folder in files:
        if Path(folder).is_dir() and not any(f.path.startswith(str(Path(folder)) + "/")
                                             for f in loaded.files):
            click.echo(f"{folder}: no *.rules files")
    if bad:
        sys.exit(1)


def is_shipped(path: str) -> bool:
    """Whether a rule file is one of the shipped ones (as loaded, or by its place)."""
    from importlib import resources

    if path.startswith("builtin/"):
        return True
    try:
        folder = Path(str(resources.files("gpuwhy.rules") / "builtin")).resolve()
        return Path(path).resolve().parent == folder
    except (OSError, TypeError, ValueError):
        return False


def lint_rule(rule: m.Rule, known: dict[str, m.Rule] | None = None,
              shipped: bool = False) -> list[str]:
    """What a finding of this rule would lack: group, cause, 2-4 fixes, a verification;
    for a ``shipped`` rule its 'kind:'; with ``known`` (the rules by id), an 'explains:'
    id that is no rule there (a cause explains symptoms, and causes it brings about: a failed
    GPU its peers' collective hang)."""
    where = f"{rule.location}: rule {rule.id}"
    problems = []
    if not rule.group:
        problems.append(f"{where}: no 'group:' (one of {', '.join(m.GROUPS)})")
    if shipped and not rule.kind_declared:
        problems.append(f"{where}: no 'kind:' (one of {', '.join(m.KINDS)})")
    for rule_id in rule.explains:
        if known is not None and rule_id not in known:
            problems.append(f"{where}: 'explains:' names no rule {rule_id!r}")
    if not rule.cause:
        problems.append(f"{where}: no 'cause:' (the root cause in plain words)")
    if not 2 <= len(rule.fixes) <= 4:
        problems.append(f"{where}: {len(rule.fixes)} 'fix:' clauses; give 2 to 4")
    if not rule.verify:
        problems.append(f"{where}: no 'verify:' (how to check the fix worked)")
    return problems


@rules.command("set")
@click.argument("rule_id")
@click.argument("changes", nargs=-1)
@click.option("--reset", is_flag=True, help="Drop the rule's override first.")
@click.pass_obj
def set_rule(obj: Any, rule_id: str, changes: tuple[str, ...], reset: bool) -> None:
    """Override a rule: enabled=true|false, shadow=true|false, threshold NAME=VALUE ...

    The override is kept in the store; the running service applies it at its next round.

    \b
    Examples:
      gpuwhy rules set R14_bursty_utilisation enabled=false
      gpuwhy rules set R23 shadow=true
      gpuwhy rules set R01 threshold busy_util=0.7 worker_busy=0.8
      gpuwhy rules set R01 --reset
    """
    from gpuwhy.store import open_store
    from gpuwhy.store.overrides import set_override

    rule = _find(_rules(obj), rule_id)
    enabled = shadow = None
    thresholds: dict[str, str] = {}
    in_thresholds = False
    for change in changes:
        if change == "threshold":
            in_thresholds = True
            continue
        name, sep, value = change.partition("=")
        if not sep:
            raise click.UsageError(f"expected NAME=VALUE, got {change!r}")
        if in_thresholds:
            thresholds[name] = value
        elif name == "enabled":
            enabled = value
        elif name == "shadow":
            shadow = value
        else:
            raise click.UsageError(f"unknown setting {name!r}: enabled=, shadow= or "
                                   f"threshold NAME=VALUE")
    if not changes and not reset:
        raise click.UsageError("nothing to change")
    try:
        db = open_store(obj.config()["store.path"])
        try:
            new = set_override(db, rule, enabled, shadow, thresholds, reset=reset)
        finally:
            db.close()
    except GpuwhyError as exc:
        raise _fail(exc) from None
    params = " ".join(f"{k}={v:g}" for k, v in new.params.items()) or "defaults"
    click.echo(f"{rule.id}: enabled={str(new.enabled).lower()} "
               f"shadow={str(new.shadow).lower()} thresholds: {params}")


def read_capture(path: str) -> list:
    """The events of a capture (JSON lines of bus payloads; gzipped where it ends in .gz),
    in time order.

    A line that is not an event is reported with its line number; nothing is guessed.
    """
    from gpuwhy.events import EVENT_TYPES
    from gpuwhy.wire import from_frames

    events = []
    with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                kind = json.loads(line).get("kind")
                cls = EVENT_TYPES[kind]
                events.append(from_frames([cls.topic.encode(), line.strip()]).event)
            except (ValueError, KeyError, AttributeError, DecodeError) as exc:
                raise click.ClickException(f"{path}:{number}: not a bus event: {exc}") from None
    events.sort(key=lambda e: e.ts)
    return events


def replay(events: list, rules: list[m.Rule], every_ns: int,
           each_round: Callable[[int, list], None] | None = None) -> tuple[list, Engine]:
    """Replay a capture's ``events`` (in time order) through the real engine with in-memory
    signals, evaluating every ``every_ns`` of capture time: (findings, engine).
    ``each_round(now, new_findings)`` is called after every round (`gpuwhy rules eval`)."""
    from gpuwhy.correlator.rules.engine import Engine
    from gpuwhy.correlator.rules.signals import MemorySignals

    signals = MemorySignals()
    engine = Engine(rules, signals, interval_ns=every_ns)
    step = every_ns
    # Past the last event, every rule gets one more round (its own 'every' may be longer).
    end = events[-1].ts + max([r.every_ns or step for r in rules] + [step])
    now, i, findings = events[0].ts + step, 0, []
    while now <= end:
        while i < len(events) and events[i].ts <= now:
            signals.add(events[i])
            i += 1
        new = engine.evaluate(now)
        findings += new
        if each_round is not None:
            each_round(now, new)
        now += step
        if i < len(events) and events[i].ts > now + step:   # a gap: no need to walk it
            now += (events[i].ts - now) // step * step
    return findings, engine


@rules.command("test")
@click.argument("files", nargs=-1, type=InputFile(dir_okay=True))
@click.option("--replay", "capture", required=True, type=InputFile(),
              help="A capture made by `gpuwhy record` (JSON lines).")
@click.option("--builtin", is_flag=True, help="Also run the shipped rules.")
@click.option("--every", default=10.0, show_default=True, help="Seconds between evaluations.")
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON lines.")
def test_rules(files: tuple[str, ...], capture: str, builtin: bool, every: float,
               as_json: bool) -> None:
    """Run rules over a recorded capture and print the findings, in capture time.

    Rules that read env() see the variables the probes recorded in the capture's
    ProcessSeen events (the probes.environment setting of the host that recorded it).

    \b
    Examples:
      gpuwhy rules test my.rules --replay capture.jsonl
      gpuwhy rules test --builtin --replay capture.jsonl --json
    """
    from gpuwhy.identity import mig_instance_name
    from gpuwhy.rules.loader import load_rules

    if not files and not builtin:
        raise click.UsageError("give rule files, --builtin, or both")
    try:
        loaded = load_rules(list(files), builtin=builtin)
    except GpuwhyError as exc:
        raise _fail(exc) from None
    events = read_capture(capture)
    if not events:
        raise click.ClickException(f"{capture}: no events")
    if int(every * NS) <= 0:
        raise click.UsageError("--every must be positive")
    findings, engine = replay(events, loaded, int(every * NS))
    start = events[0].ts
    for f in findings:
        if as_json:
            click.echo(json.dumps({**vars(f), "process": str(f.process) if f.process else None,
                                   "processes": [str(p) for p in f.processes]}))
            continue
        who = f" process {f.process}" if f.process else \
            f" {mig_instance_name(f.instance, f.mig_profile)}" if f.instance else ""
        click.echo(f"+{(f.ts - start) / NS:7.0f}s {f.state:<8} {f.severity:<8} {f.rule_id} "
                   f"on {f.gpu_id}{who}: {f.title}")
        if f.state == "firing":
            click.echo("          evidence: " + ", ".join(
                f"{k}={v}" for k, v in f.evidence.items()))
            for fix in f.fixes:
                click.echo(f"          fix: {fix}")
    if not as_json:
        counts = Counter(s["status"] for s in engine.status())
        click.echo(f"{len(events)} events, {len(findings)} findings; instances: "
                   + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


@rules.command()
@click.option("--markdown", is_flag=True, help="Print the table of docs/rules.md.")
def signals(markdown: bool) -> None:
    """Every name a rule can read: signals, facts, process text, event streams.

    \b
    Example:
      gpuwhy rules signals | grep gpu.
    """
    from gpuwhy.rules.docs import signals_markdown
    from gpuwhy.rules.vocabulary import describe

    if markdown:
        click.echo(signals_markdown(), nl=False)
        return
    click.echo(table(["signal", "unit", "meaning"], describe()))


@click.command()
@click.argument("output", type=OutputFile())
@click.option("--duration", type=float, required=True, help="Seconds to record.")
@click.option("--endpoint", default="ipc:///run/gpuwhy/record.sock", show_default=True,
              help="Endpoint the recorder binds; point sources at it with GPUWHY_BUS.")
@click.option("--sources", default="", help="Unprivileged sources to run into the capture, "
              "comma-separated (gpu, klog, cron).")
@click.pass_obj
def record(obj: Any, output: str, duration: float, endpoint: str, sources: str) -> None:
    """Record bus traffic to OUTPUT as JSON lines, for `gpuwhy rules test --replay`.

    The running service's correlator owns bus.endpoint (only one socket can bind it), so
    the recorder binds its own ENDPOINT instead and records whatever connects to it: the
    sources named with --sources, which it runs itself, and any source started with
    GPUWHY_BUS=ENDPOINT (e.g. the probes). The service is not disturbed.

    \b
    Examples:
      GPUWHY_GPU_SOURCE=sim GPUWHY_SIM_SCENARIO=input-starved \\
          gpuwhy record --duration 300 --sources gpu,cron starved.jsonl
      # the probes (root) into the same capture, from another shell:
      sudo GPUWHY_BUS=ipc:///run/gpuwhy/record.sock gpuwhy probes
    """
    from gpuwhy.app.service import unprivileged_sources
    from gpuwhy.bus import Subscriber
    from gpuwhy.wire import to_payload

    config = obj.config(**{"bus.endpoint": endpoint})
    runners = unprivileged_sources(config)
    chosen = [s for s in sources.split(",") if s]
    unknown = [s for s in chosen if s not in runners or s == "rules"]
    if unknown:
        raise click.UsageError(f"unknown source(s) {', '.join(unknown)}; "
                               f"one of {', '.join(n for n in runners if n != 'rules')}")
    try:
        subscriber = Subscriber(endpoint, hwm=config["bus.hwm"])
    except GpuwhyError as exc:
        raise _fail(exc) from None
    stop = threading.Event()
    threads = [threading.Thread(target=runners[name], args=(config, stop), daemon=True,
                                name=f"record-{name}") for name in chosen]
    kinds: Counter[str] = Counter()
    try:
        with open(output, "wb") as out:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline:
                envelope = subscriber.receive(min(0.2, max(0.0, deadline - time.monotonic())))
                if envelope is None:
                    continue
                out.write(to_payload(envelope.event, src=envelope.src, seq=envelope.seq) + b"\n")
                kinds[envelope.event.kind] += 1
            stop.set()
            for thread in threads:
                thread.join(3.0)
            drain_until = time.monotonic() + 1.0   # what they sent last; a source that is
            while time.monotonic() < drain_until:  # still publishing must not keep us here
                envelope = subscriber.receive(0.1)
                if envelope is None:
                    break
                out.write(to_payload(envelope.event, src=envelope.src, seq=envelope.seq) + b"\n")
                kinds[envelope.event.kind] += 1
    finally:
        stop.set()
        subscriber.close()
    summary = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    click.echo(f"recorded {sum(kinds.values())} events to {output}: {summary or 'none'}")
    lost = subscriber.counters.get("gap_messages", 0)
    if lost:
        click.echo(f"warning: {lost} messages lost (sequence gaps)", err=True)
