"""`gpuwhy db info|prune|rollup|check|schema`: look after the SQLite store by hand."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.store.budget import MB, measure
from gpuwhy.store.retention import Windows, prune
from gpuwhy.store.rollups import DONE_MARK, get_mark, roll_up
from gpuwhy.text import format_ts

RUNNING_AFTER_S = 10   # a correlator heartbeat this fresh means the service is writing


def _open(ctx: object, readonly: bool = False):  # noqa: ANN202 - click glue
    from gpuwhy.store import open_store

    config = ctx.config()
    path = config["store.path"]
    if readonly and not Path(path).exists():
        raise click.ClickException(f"no store at {path} (set --config or GPUWHY_DB)")
    try:
        return config, open_store(path, readonly=readonly)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None


def _refuse_second_writer(db: object, force: bool) -> None:
    row = db.execute("SELECT last_seen FROM source_health WHERE source = 'correlator'"
                     ).fetchone()
    if row and not force and (now_ns() - row[0]) / NS_PER_SECOND < RUNNING_AFTER_S:
        raise click.ClickException(
            "the gpuwhy service is writing this store (it prunes and rolls up by itself "
            "every store.maintenance_interval); stop it first or pass --force")




def _utc(ts: int | None) -> str:
    return format_ts(ts, "s", utc=True)


@click.group()
def db() -> None:
    """Look after the store: size, retention, rollups, integrity, schema.

    \b
    Examples:
      gpuwhy db info
      gpuwhy db check
      gpuwhy db schema --markdown
    """


@db.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def info(ctx: object, as_json: bool) -> None:
    """Size against the cap, rows per table, what the raw samples and rollups cover.

    \b
    Examples:
      gpuwhy db info
      gpuwhy db info --json | jq .size.state
    """
    config, store = _open(ctx, readonly=True)
    with store.conn:
        size = measure(store, config["store.max_mb"], config["store.warn_fraction"])
        tables = {name: store[name].count for name in sorted(store.table_names())
                  if not name.startswith("_")}
        raw = store.execute("SELECT min(ts), max(ts) FROM gpu_sample_data").fetchone()
        rolled = store.execute("SELECT min(minute), max(minute) FROM gpu_rollup_data"
                               ).fetchone()
        mark = get_mark(store, DONE_MARK)
    store.close()
    report = {"path": config["store.path"], "size": size.as_dict(), "tables": tables,
              "raw_samples": {"from": raw[0], "to": raw[1]},
              "rollups": {"from": rolled[0], "to": rolled[1], "done_until": mark},
              "retention_days": {"raw": config["store.raw_days"],
                                 "rollups": config["store.rollup_days"],
                                 "events": config["store.event_days"]}}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"store    {report['path']}")
    click.echo(f"size     {size.state}: {size.describe()}; file {size.file_bytes / MB:.1f} MB, "
               f"WAL {size.wal_bytes / MB:.1f} MB")
    click.echo(f"raw      {_utc(raw[0])} .. {_utc(raw[1])}  "
               f"(kept {config['store.raw_days']:g} days once rolled up)")
    click.echo(f"rollups  {_utc(rolled[0])} .. {_utc(rolled[1])}  "
               f"(done until {_utc(mark)}, kept {config['store.rollup_days']:g} days)")
    click.echo(f"events   kept {config['store.event_days']:g} days")
    for name, count in tables.items():
        click.echo(f"  {name:<22} {count:>12,}")


@db.command("prune")
@click.option("--force", is_flag=True, help="Run even while the service is writing.")
@click.pass_obj
def prune_command(ctx: object, force: bool) -> None:
    """Delete what is past its retention window now, in small batches.

    The service does this by itself; this is for a stopped service or new settings.

    \b
    Examples:
      GPUWHY_RAW_DAYS=3 gpuwhy db prune
    """
    config, store = _open(ctx)
    _refuse_second_writer(store, force)
    windows = Windows(config["store.raw_days"], config["store.rollup_days"],
                      config["store.event_days"])
    result = prune(store, windows, now_ns(), config["store.prune_batch"])
    store.close()
    for table, rows in sorted(result.deleted.items()):
        click.echo(f"  {table:<22} {rows:>12,} rows deleted")
    click.echo(f"{sum(result.deleted.values()):,} rows in {result.batches} batches; "
               f"longest batch {result.longest_batch_ms:.1f} ms")


@db.command("rollup")
@click.option("--force", is_flag=True, help="Run even while the service is writing.")
@click.pass_obj
def rollup_command(ctx: object, force: bool) -> None:
    """Roll up every finished minute of raw samples not rolled up yet.

    \b
    Examples:
      gpuwhy db rollup
    """
    _, store = _open(ctx)
    _refuse_second_writer(store, force)
    total, started = 0, time.monotonic()
    while True:
        done = roll_up(store, now_ns(), max_minutes=60)
        total += done
        if done < 60:
            break
    mark = get_mark(store, DONE_MARK)
    store.close()
    click.echo(f"{total} minutes rolled up in {time.monotonic() - started:.2f} s; "
               f"done until {_utc(mark)}")


@db.command()
@click.pass_obj
def check(ctx: object) -> None:
    """Integrity check, pending migrations and the size cap; exit 1 on a problem.

    \b
    Examples:
      gpuwhy db check && echo fine
    """
    from gpuwhy.store.migrations import migrations

    config, store = _open(ctx, readonly=True)
    integrity = [r[0] for r in store.execute("PRAGMA integrity_check").fetchall()]
    pending = [m.name for m in migrations.pending(store)]
    size = measure(store, config["store.max_mb"], config["store.warn_fraction"])
    store.close()
    problems = [] if integrity == ["ok"] else [f"integrity: {line}" for line in integrity[:20]]
    if pending:
        problems.append(f"migrations not applied yet (the service applies them): "
                        f"{', '.join(pending)}")
    if size.state != "ok":
        problems.append(f"size {size.state}: {size.describe()}")
    click.echo(f"integrity {'ok' if integrity == ['ok'] else 'FAILED'}; "
               f"{len(pending)} pending migrations; size {size.state}: {size.describe()}")
    for problem in problems:
        click.echo(f"  {problem}")
    sys.exit(1 if problems else 0)


@db.command()
@click.option("--markdown", is_flag=True, help="Print docs/schema.md's generated part.")
@click.option("--check", "check_file", type=click.Path(exists=True, dir_okay=False),
              help="Compare a schema page with the live schema; exit 1 if stale.")
def schema(markdown: bool, check_file: str | None) -> None:
    """The tables and views, with their columns and units.

    \b
    Examples:
      gpuwhy db schema
      gpuwhy db schema --check docs/schema.md
    """
    from gpuwhy.store.schema_doc import check_page, fresh_schema

    live = fresh_schema()
    if check_file:
        problems = check_page(Path(check_file).read_text(), live)
        for problem in problems:
            click.echo(problem)
        click.echo(f"{check_file}: {'stale' if problems else 'up to date'}")
        sys.exit(1 if problems else 0)
    if markdown:
        click.echo(live, nl=False)
        return
    for line in live.splitlines():
        if line.startswith("### "):
            click.echo(line[4:].replace("`", ""))
        elif line.startswith("| ") and not line.startswith(("| column", "|---")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            click.echo(f"    {cells[0]:<28} {cells[1]:<8} {cells[2]}")
