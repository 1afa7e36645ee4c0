"""`gpuwhy db info|prune|rollup|check|schema`: look after the SQLite store by hand."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import click

from gpuwhy.app.clitypes import InputFile
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.files import FileRefused, read_regular
from gpuwhy.store import inventory
from gpuwhy.store.budget import MB, measure
from gpuwhy.store.retention import Windows, prune
from gpuwhy.store.rollups import DONE_MARK, get_mark, roll_up
from gpuwhy.text import format_ts

RUNNING_AFTER_S = 10   # a correlator heartbeat this fresh means the service is writing
MAX_PAGE_BYTES = 4 << 20   # docs/schema.md is ~60 kB; a schema page past this is no page


class StoreUnusable(click.ClickException):
    """The store cannot be used as it is (unreadable, not a database, from a newer gpuwhy):
    an environment error, exit status 2 like a usage error."""

    exit_code = 2


def _open(ctx: Any, readonly: bool = False, newer_ok: bool = False):  # noqa: ANN202
    """The config and the store, opened and readable; :class:`StoreUnusable` otherwise
    (``newer_ok``: a store from a newer gpuwhy is opened too, for `db check` to report)."""
    from gpuwhy.store import open_store
    from gpuwhy.store.migrations import refuse_newer

    config = ctx.config()
    path = config["store.path"]
    if readonly and not Path(path).exists():
        raise StoreUnusable(f"no store at {path} (set --config or GPUWHY_DB)")
    try:
        store = open_store(path, readonly=readonly)
    except GpuwhyError as exc:
        raise StoreUnusable(str(exc)) from None
    try:
        # a read-only open reads nothing yet: a file that is no database (a zeroed header)
        # fails here, at the first read, not in the middle of a command
        inventory.first_read(store)
        if not newer_ok:
            refuse_newer(store)
    except sqlite3.DatabaseError as exc:
        store.close()
        raise StoreUnusable(f"cannot read store {path}: {exc}") from None
    except GpuwhyError as exc:
        store.close()
        raise StoreUnusable(str(exc)) from None
    return config, store


def _refuse_second_writer(db: Any, force: bool) -> None:
    last_seen = inventory.correlator_last_seen(db)
    if last_seen is not None and not force and \
            (now_ns() - last_seen) / NS_PER_SECOND < RUNNING_AFTER_S:
        raise click.ClickException(
            "the gpuwhy service is writing this store (it prunes and rolls up by itself "
            "every store.maintenance_interval); stop it first or pass --force")




def _utc(ts: int | None) -> str:
    return format_ts(ts, "s", utc=True)


@click.group()
def db() -> None:
    """Look after the store: size, retention, rollups, integrity, schema.

    A store that cannot be used (missing, not a database, written by a newer gpuwhy) is an
    error with exit status 2; `db check` reports it as a problem (exit 1) instead.

    \b
    Examples:
      gpuwhy db info
      gpuwhy db check
      gpuwhy db schema --markdown
    """


@db.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def info(ctx: Any, as_json: bool) -> None:
    """Size against the cap, rows per table, what the raw samples and rollups cover.

    \b
    Examples:
      gpuwhy db info
      gpuwhy db info --json | jq .size.state
    """
    config, store = _open(ctx, readonly=True)
    try:
        with store.conn:
            size = measure(store, config["store.max_mb"], config["store.warn_fraction"])
            tables = inventory.table_rows(store)
            raw = inventory.sample_span(store)
            rolled = inventory.rollup_span(store)
            mark = get_mark(store, DONE_MARK)
    except sqlite3.DatabaseError as exc:     # a corrupt page met on the way
        raise StoreUnusable(f"cannot read store {config['store.path']}: {exc} "
                            "(`gpuwhy db check` says more)") from None
    finally:
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
def prune_command(ctx: Any, force: bool) -> None:
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
def rollup_command(ctx: Any, force: bool) -> None:
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
def check(ctx: Any) -> None:
    """Integrity check, pending migrations and the size cap; exit 1 on a problem.

    \b
    Examples:
      gpuwhy db check && echo fine
    """
    from gpuwhy.store.migrations import migrations, newer_schema

    try:
        config, store = _open(ctx, readonly=True, newer_ok=True)
    except StoreUnusable as exc:
        if not Path(ctx.config()["store.path"]).is_file():
            raise
        click.echo(f"integrity FAILED: {exc.message}")     # a file, but no database
        sys.exit(1)
    try:
        integrity = inventory.integrity_check(store)
        newer = newer_schema(store)
        pending = [m.name for m in migrations.pending(store)]
        size = measure(store, config["store.max_mb"], config["store.warn_fraction"])
    except sqlite3.DatabaseError as exc:
        integrity, newer, pending, size = [str(exc)], [], [], None
    store.close()
    if size is None:
        click.echo(f"integrity FAILED: {integrity[0]}")
        sys.exit(1)
    problems = [] if integrity == ["ok"] else [f"integrity: {line}" for line in integrity[:20]]
    if newer:
        problems.append(f"written by a newer gpuwhy (schema steps this build does not know: "
                        f"{', '.join(newer[:5])}): this build refuses to run on it")
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
@click.option("--check", "check_file", type=InputFile(),
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
        try:
            text = read_regular(check_file, MAX_PAGE_BYTES).decode("utf-8")
        except (FileRefused, UnicodeDecodeError) as exc:
            raise StoreUnusable(f"cannot check {check_file}: {exc}") from None
        problems = check_page(text, live)
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
