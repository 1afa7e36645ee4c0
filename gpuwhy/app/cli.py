"""The `gpuwhy` command line: one group, one subcommand per part, mirroring the library."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from gpuwhy import __version__
from gpuwhy.app.clitypes import InputFile, OutputFile
from gpuwhy.config import SETTINGS, Config, load_config
from gpuwhy.errors import GpuwhyError


class _Context:
    """What the group passes to subcommands: the config, loaded on first use."""

    def __init__(self, config_path: str | None):
        self.config_path = config_path
        self._config: Config | None = None

    def config(self, **overrides: object) -> Config:
        try:
            if self._config is None:
                self._config = load_config(self.config_path)
            changes = {k: v for k, v in overrides.items() if v is not None}
            return self._config.replace(changes) if changes else self._config
        except GpuwhyError as exc:
            raise click.ClickException(str(exc)) from None


class _LogFormatter(logging.Formatter):
    """Log lines stamped as every other time gpuwhy prints: gpuwhy.text.format_ts, local
    time with its zone (logging's own asctime has no zone)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        from gpuwhy.text import format_ts

        return format_ts(int(record.created * 1_000_000_000))


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormatter("%(asctime)s gpuwhy[%(process)d] %(name)s "
                                       "%(levelname)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def _stop_on_signals(stop: threading.Event | None = None,
                     callback: object = None) -> threading.Event:
    stop = stop or threading.Event()

    def handler(signum: int, frame: object) -> None:
        logging.getLogger("gpuwhy").info("%s received: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


class _LazyGroup(click.Group):
    """A group whose subcommands are imported when run, not when the group is: `gpuwhy
    probes` and `gpuwhy up` then load only their own parts (importing every command's
    module cost each long-running process 7 MB and 130 modules it never used)."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, _, attr = self.lazy[name].partition(":")
            found = getattr(importlib.import_module(module), attr)
            self.add_command(found if isinstance(found, click.Command) else found(), name)
        return super().get_command(ctx, name)


def _rules_group() -> click.Group:
    from gpuwhy.app.rules_cli import rules
    from gpuwhy.app.rules_eval_cli import evaluate

    rules.add_command(evaluate)
    return rules


# Every other part's commands, by the module that defines them (the library's layout).
LAZY_COMMANDS = {
    # the probes
    "trace": "gpuwhy.probes.trace:trace",
    "proc": "gpuwhy.app.proc_cli:proc",
    "cuda": "gpuwhy.app.cuda_cli:cuda",
    # the GPU sources
    "gpu": "gpuwhy.app.gpu_cli:gpu",
    "dcgm": "gpuwhy.app.gpu_cli:dcgm",
    # the kernel log and cron sources
    "xid": "gpuwhy.app.klog_cli:xid",
    "cron": "gpuwhy.app.cron_cli:cron",
    # the answer
    "why": "gpuwhy.app.why_cli:why",
    "mcp": "gpuwhy.app.mcp_cli:mcp",
    # the correlator
    "incidents": "gpuwhy.app.incidents_cli:incidents",
    "incident": "gpuwhy.app.incidents_cli:incident",
    "resets": "gpuwhy.app.incidents_cli:resets",
    "demo": "gpuwhy.app.demo.scenarios:demo",
    # the rules
    "rules": "gpuwhy.app.cli:_rules_group",
    "record": "gpuwhy.app.rules_cli:record",
    # the store
    "db": "gpuwhy.app.db_cli:db",
    # the deployment
    "check-env": "gpuwhy.app.deploy_cli:check_env",
    # checks and reports
    "check": "gpuwhy.app.checks_cli:check",
    "baseline": "gpuwhy.app.checks_cli:baseline",
    "report": "gpuwhy.app.report_cli:report",
    # the benchmarks
    "bench": "gpuwhy.app.bench_cli:bench",
}


@click.group(cls=_LazyGroup, lazy=LAZY_COMMANDS, epilog="""\b
Examples:
  gpuwhy up                      # everything, web view at http://127.0.0.1:8000
  gpuwhy status --json           # health of every part and source
  gpuwhy settings                # every setting, its default and environment variable
  GPUWHY_DEVICE_GLOB='/tmp/fake/nvidia*' gpuwhy up --port 8001
""")
@click.version_option(__version__, prog_name="gpuwhy")
@click.option("--config", "config_path", type=InputFile(),
              envvar="GPUWHY_CONFIG", help="TOML config file (default: $GPUWHY_CONFIG).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """gpuwhy: why is this GPU not busy, and what broke it?

    Watches every process on an NVIDIA GPU host without touching it (eBPF), correlates
    what it sees, keeps it in SQLite and shows it in a web view.
    """
    ctx.obj = _Context(config_path)


def _run_service(ctx: _Context, with_probes: bool, host: str | None, port: int | None,
                 pidfile: str | None) -> None:
    from gpuwhy.app.service import Service
    from gpuwhy.correlator.pipeline import tune_gc
    from gpuwhy.lifeline import ParentGone, die_with_parent_named_in
    from gpuwhy.memory import limit_malloc_arenas

    limit_malloc_arenas()        # before any thread: each would take an arena of its own

    config = ctx.config(**{"web.host": host, "web.port": port})
    _setup_logging(config["log.level"])
    stop = _stop_on_signals()
    try:
        # Started by a harness that names itself (a benchmark, a demo): stop cleanly when it
        # goes, even killed, instead of running on with the probes attached.
        die_with_parent_named_in(signum=signal.SIGTERM)
    except ParentGone as exc:
        raise click.ClickException(f"{exc}: not starting the service") from None
    try:
        service = Service(config, with_probes=with_probes, config_path=ctx.config_path,
                          shutdown=stop)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {config['web.host']}:"
                                   f"{config['web.port']}: {exc.strerror}") from None
    if pidfile:
        Path(pidfile).write_text(f"{os.getpid()}\n")
    tune_gc()
    try:
        service.start()
        service.wait()
    finally:
        service.stop()
        if pidfile:
            Path(pidfile).unlink(missing_ok=True)
        logging.getLogger("gpuwhy").info("stopped cleanly")


@cli.command()
@click.option("--host", help="Address of the web view (loopback only) [web.host].")
@click.option("--port", type=int, help="Port of the web view [web.port].")
@click.option("--pidfile", type=OutputFile(), help="Write our pid here.")
@click.pass_obj
def up(ctx: _Context, host: str | None, port: int | None, pidfile: str | None) -> None:
    """Run everything: probes, bus, correlator, store and web view.

    \b
    Examples:
      sudo gpuwhy up
      sudo gpuwhy up --port 8001 --config /etc/gpuwhy/config.toml
    SIGTERM or SIGINT stops every part cleanly.
    """
    _run_service(ctx, True, host, port, pidfile)


@cli.command()
@click.option("--host", help="Address of the web view (loopback only) [web.host].")
@click.option("--port", type=int, help="Port of the web view [web.port].")
@click.pass_obj
def serve(ctx: _Context, host: str | None, port: int | None) -> None:
    """Run the unprivileged parts only: correlator, store and web view.

    \b
    Example (the probes run elsewhere, e.g. as their own systemd unit):
      gpuwhy serve --port 8000
    """
    _run_service(ctx, False, host, port, None)


@cli.command()
@click.option("--ebpf", is_flag=True, help="Print the BPF C programs and exit.")
@click.option("--only", type=click.Choice(["stacks"]),
              help="Run only this privileged source: `stacks`, the Python stack sampler "
                   "(CAP_SYS_PTRACE alone: systemd/gpuwhy-stacks.service).")
@click.pass_obj
def probes(ctx: _Context, ebpf: bool, only: str | None) -> None:
    """Run the privileged eBPF probes and publish on the bus (needs root).

    \b
    Examples:
      sudo gpuwhy probes
      gpuwhy probes --ebpf | less
      gpuwhy probes --only stacks    # the Python stack sampler alone (CAP_SYS_PTRACE)
    """
    from gpuwhy.lifeline import ParentGone, die_with_parent_named_in

    try:
        # First: started by `gpuwhy up`, the probes must not outlive it (gpuwhy.lifeline).
        die_with_parent_named_in()
    except ParentGone as exc:
        raise click.ClickException(f"{exc}: not starting the probes") from None
    if only == "stacks":
        _run_stack_sampler_alone(ctx)
        return
    from gpuwhy.probes import fdtrack

    if ebpf:
        click.echo(fdtrack.ebpf_text())
        return
    from gpuwhy.memory import limit_malloc_arenas
    from gpuwhy.probes.privileged import run_probes

    limit_malloc_arenas()
    config = ctx.config()
    _setup_logging(config["log.level"])
    stop = _stop_on_signals()
    try:
        run_probes(config, stop)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None


def _run_stack_sampler_alone(ctx: _Context) -> None:
    """The stack sampler as a process of its own (its unit holds CAP_SYS_PTRACE and none of
    the eBPF probes' capabilities), without loading bcc or any probe."""
    from gpuwhy.memory import limit_malloc_arenas
    from gpuwhy.probes.stack_sampler import run_stack_sampler

    limit_malloc_arenas()
    config = ctx.config()
    _setup_logging(config["log.level"])
    stop = _stop_on_signals()
    try:
        run_stack_sampler(config, stop, alone=True)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing; exit 0 when healthy.")
@click.pass_obj
def status(ctx: _Context, as_json: bool, quiet: bool) -> None:
    """Health of every part and source. Exit status: 0 healthy; 1 not healthy (the web view
    or the correlator down or stalled); 2 degraded (running, but a part is degraded, failed
    or stalled - see gpuwhy.stalls -, a source's reads all fail, a part dropped records in
    its current run, or the store's disk is full, its pages corrupt or its schema newer).

    What this host cannot offer is said on a "limited" line and is no fault: simulated GPU
    counters where no NVIDIA driver is loaded (or gpu.source = "sim"), cron's schedule
    without its executions where no journald runs.

    \b
    Examples:
      gpuwhy status
      gpuwhy status --json | jq '.parts[] | select(.state != "ok")'
    """
    from gpuwhy.app.status import EXIT_CODES, collect_status
    from gpuwhy.text import format_ts, printable

    report = collect_status(ctx.config())
    if as_json:
        click.echo(json.dumps(report, indent=2))
    elif not quiet:
        why = [f"{part} stalled" for part in report["stalled"]] + \
            [f"{part} failed" for part in report["failed"]] + \
            [f"{part} degraded" for part in report["degraded"]] + \
            [f"{part} dropped records" for part in report["dropping"]]
        headline = {"healthy": "healthy", "unhealthy": "NOT healthy",
                    "degraded": f"DEGRADED ({', '.join(why)})"}
        click.echo(f"gpuwhy {headline[report['state']]} (store {report['store']})")
        for name, reason in report["limited"].items():
            click.echo(f"  limited on this host: {name}: {printable(reason)}")
        for part in report["parts"]:
            age = "" if part["age_s"] is None else f"{part['age_s']:>6.1f}s ago"
            counters = " ".join(f"{k}={v}" for k, v in sorted(part["counters"].items()) if v)
            detail = "  ".join(x for x in (part["detail"], counters) if x)
            click.echo(f"  {part['part']:<11} {part['state']:<9} {age:>11}  {detail}")
        for gpu in report["gpus"]:
            index = "?" if gpu["index"] is None else gpu["index"]
            gpu_why = "" if gpu["health"] == "ok" else \
                f"since {format_ts(gpu['since'])}: {gpu['cause']} ({gpu['evidence']}); " \
                f"clears with {gpu['clears']}"
            click.echo(f"  GPU {index!s:<7} {gpu['health']:<15} {printable(gpu['gpu'])}  "
                       f"{printable(gpu_why)}".rstrip())
    sys.exit(EXIT_CODES[report["state"]])


SECRET_SETTINGS = ("token", "password", "secret")


def settings_markdown() -> str:
    """The table of docs/settings.md: every setting, its default, variable, allowed values."""
    lines = ["| setting | default | environment | allowed | meaning |", "|---|---|---|---|---|"]
    lines += [f"| `{s.name}` | `{json.dumps(s.default)}` | `{s.env}` | {_allowed_text(s.name)} "
              f"| {s.help} |" for s in SETTINGS]
    return "\n".join(lines) + "\n"


def _allowed_text(name: str) -> str:
    """What a setting allows, in words (a setting without its entry yet says so: the test
    that every setting has one fails, this page does not)."""
    from gpuwhy.config import ALLOWED

    allowed = ALLOWED.get(name)
    return allowed.text if allowed else "(not checked yet)"


def _shown(name: str, value: object) -> object:
    """A setting's value as printed: secrets are masked."""
    if value and any(word in name for word in SECRET_SETTINGS):
        return "********"
    return value


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--markdown", is_flag=True, help="Print the table of docs/settings.md.")
@click.pass_obj
def settings(ctx: _Context, as_json: bool, markdown: bool) -> None:
    """Every setting: name, value in effect, default, environment variable, meaning.

    \b
    Examples:
      gpuwhy --config /etc/gpuwhy/config.toml settings
      gpuwhy settings --markdown      # the table in docs/settings.md
    """
    if markdown:
        click.echo(settings_markdown(), nl=False)
        return
    config = ctx.config()
    rows = [{"name": s.name, "value": _shown(s.name, config[s.name]), "default": s.default,
             "env": s.env, "help": s.help} for s in SETTINGS]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['name']:<26} {row['value']!r:<30} ${row['env']}\n    {row['help']}")
