"""The `gpuwhy` command line: one group, one subcommand per part, mirroring the library."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import click

from gpuwhy import __version__
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


@click.group(epilog="""\b
Examples:
  gpuwhy up                      # everything, web view at http://127.0.0.1:8000
  gpuwhy status --json           # health of every part and source
  gpuwhy settings                # every setting, its default and environment variable
  GPUWHY_DEVICE_GLOB='/tmp/fake/nvidia*' gpuwhy up --port 8001
""")
@click.version_option(__version__, prog_name="gpuwhy")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
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
    from gpuwhy.correlator.service import tune_gc
    from gpuwhy.service import Service

    config = ctx.config(**{"web.host": host, "web.port": port})
    _setup_logging(config["log.level"])
    stop = _stop_on_signals()
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
@click.option("--pidfile", type=click.Path(dir_okay=False), help="Write our pid here.")
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
@click.pass_obj
def probes(ctx: _Context, ebpf: bool) -> None:
    """Run the privileged eBPF probes and publish on the bus (needs root).

    \b
    Examples:
      sudo gpuwhy probes
      gpuwhy probes --ebpf | less
    """
    from gpuwhy.lifeline import ParentGone, die_with_parent_named_in

    try:
        # First: started by `gpuwhy up`, the probes must not outlive it (gpuwhy.lifeline).
        die_with_parent_named_in()
    except ParentGone as exc:
        raise click.ClickException(f"{exc}: not starting the probes") from None
    from gpuwhy.probes import fdtrack

    if ebpf:
        click.echo(fdtrack.ebpf_text())
        return
    from gpuwhy.probes.service import run_probes

    config = ctx.config()
    _setup_logging(config["log.level"])
    stop = _stop_on_signals()
    try:
        run_probes(config, stop)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing; exit 0 when healthy.")
@click.pass_obj
def status(ctx: _Context, as_json: bool, quiet: bool) -> None:
    """Health of every part and source; exit status 0 healthy, 1 not healthy (the web view
    or the correlator down), 2 degraded (running, but a source stalled - see gpuwhy.stalls -
    or failed, or the store's disk full).

    \b
    Examples:
      gpuwhy status
      gpuwhy status --json | jq '.parts[] | select(.state != "ok")'
    """
    from gpuwhy.status import EXIT_CODES, collect_status
    from gpuwhy.text import format_ts, printable

    report = collect_status(ctx.config())
    if as_json:
        click.echo(json.dumps(report, indent=2))
    elif not quiet:
        why = [f"{part} stalled" for part in report["stalled"]] + \
            [f"{part} failed" for part in report["failed"]]
        headline = {"healthy": "healthy", "unhealthy": "NOT healthy",
                    "degraded": f"DEGRADED ({', '.join(why)})"}
        click.echo(f"gpuwhy {headline[report['state']]} (store {report['store']})")
        for part in report["parts"]:
            age = "" if part["age_s"] is None else f"{part['age_s']:>6.1f}s ago"
            counters = " ".join(f"{k}={v}" for k, v in sorted(part["counters"].items()) if v)
            detail = "  ".join(x for x in (part["detail"], counters) if x)
            click.echo(f"  {part['part']:<11} {part['state']:<9} {age:>11}  {detail}")
        for gpu in report["gpus"]:
            index = "?" if gpu["index"] is None else gpu["index"]
            why = "" if gpu["health"] == "ok" else \
                f"since {format_ts(gpu['since'])}: {gpu['cause']} ({gpu['evidence']}); " \
                f"clears with {gpu['clears']}"
            click.echo(f"  GPU {index!s:<7} {gpu['health']:<15} {printable(gpu['gpu'])}  "
                       f"{printable(why)}".rstrip())
    sys.exit(EXIT_CODES[report["state"]])


SECRET_SETTINGS = ("token", "password", "secret")


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
        click.echo("| setting | default | environment | meaning |\n|---|---|---|---|")
        for s in SETTINGS:
            click.echo(f"| `{s.name}` | `{json.dumps(s.default)}` | `{s.env}` | {s.help} |")
        return
    config = ctx.config()
    rows = [{"name": s.name, "value": _shown(s.name, config[s.name]), "default": s.default,
             "env": s.env, "help": s.help} for s in SETTINGS]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['name']:<26} {row['value']!r:<30} ${row['env']}\n    {row['help']}")


# --- commands of the probes ---
from gpuwhy.probes.cli import proc as _proc_command  # noqa: E402
from gpuwhy.probes.cuda.cli import cuda as _cuda_command  # noqa: E402
from gpuwhy.probes.trace import trace as _trace_command  # noqa: E402

cli.add_command(_trace_command)
cli.add_command(_proc_command)
cli.add_command(_cuda_command)
# --- commands of the GPU sources ---
from gpuwhy.probes.gpu.cli import dcgm as _dcgm_command  # noqa: E402
from gpuwhy.probes.gpu.cli import gpu as _gpu_command  # noqa: E402

cli.add_command(_gpu_command)
cli.add_command(_dcgm_command)
# --- commands of the kernel log and cron sources ---
from gpuwhy.probes.cron.cli import cron as _cron_command  # noqa: E402
from gpuwhy.probes.klog.cli import xid as _xid_command  # noqa: E402

cli.add_command(_xid_command)
cli.add_command(_cron_command)
# --- commands of the correlator ---
from gpuwhy.correlator.cli import incident as _incident_command  # noqa: E402
from gpuwhy.correlator.cli import incidents as _incidents_command  # noqa: E402
from gpuwhy.correlator.cli import resets as _resets_command  # noqa: E402
from gpuwhy.demo.scenarios import demo as _demo_command  # noqa: E402

cli.add_command(_incidents_command)
cli.add_command(_incident_command)
cli.add_command(_resets_command)
cli.add_command(_demo_command)
# --- commands of the rules ---
from gpuwhy.correlator.rules.cli import record as _record_command  # noqa: E402
from gpuwhy.correlator.rules.cli import rules as _rules_command  # noqa: E402

cli.add_command(_rules_command)
cli.add_command(_record_command)
from gpuwhy.correlator.rules.eval_cli import evaluate as _rules_eval_command  # noqa: E402

_rules_command.add_command(_rules_eval_command)
# --- commands of the store ---
from gpuwhy.store.cli import db as _db_command  # noqa: E402

cli.add_command(_db_command)
# --- commands of the deployment ---
from gpuwhy.deploy.cli import check_env as _check_env_command  # noqa: E402

cli.add_command(_check_env_command)
# --- commands of checks and reports ---
from gpuwhy.checks.cli import baseline as _baseline_command  # noqa: E402
from gpuwhy.checks.cli import check as _check_command  # noqa: E402
from gpuwhy.checks.report_cli import report as _report_command  # noqa: E402

cli.add_command(_check_command)
cli.add_command(_baseline_command)
cli.add_command(_report_command)
# --- commands of the benchmarks ---
from gpuwhy.bench_cli import bench as _bench_command  # noqa: E402

cli.add_command(_bench_command)
