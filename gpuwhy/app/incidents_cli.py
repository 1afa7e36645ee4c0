"""`gpuwhy incidents`, `gpuwhy incident ID`, `gpuwhy resets`: incidents and their chains;
`gpuwhy incident ID ack|resolve|note` changes one (gpuwhy.store.incident_changes, as the
web view)."""

from __future__ import annotations

import getpass
import json
import os
import sqlite3
from collections.abc import Callable
from typing import Any, cast

import click

from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.lifecycle import OPERATOR_CHANGES
from gpuwhy.text import format_ts as when
from gpuwhy.text import parse_ts, printable, table


def parse_since(text: str) -> int:
    """``10m``/``2h``/``1d`` ago, or an ISO date-time (local time if no zone), as realtime ns."""
    try:
        return parse_ts(text, now_ns())
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _read(ctx: click.Context, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One read of the store's read API, on a read-only connection of its own."""
    from gpuwhy.store import open_store

    config = ctx.obj.config()
    try:
        db = open_store(config["store.path"], readonly=True)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        return read(db, *args, **kwargs)
    except sqlite3.Error as exc:
        # e.g. a WAL store whose -shm file this user may not create (its folder not writable)
        raise click.ClickException(f"cannot read the store {config['store.path']} as "
                                   f"{default_actor()}: {exc} (SQLite needs to write the WAL "
                                   "files beside a store that is not in use); run the command "
                                   "as the user gpuwhy runs as (e.g. with sudo)") from None
    finally:
        db.close()


@click.command()
@click.option("--gpu", help="Only this GPU (index, UUID, PCI address or id).")
@click.option("--since", "since_text", help="Only incidents seen since (30s, 10m, 2h, 1d, ISO).")
@click.option("--until", "until_text",
              help="Only incidents opened before (30s, 10m, 2h, 1d ago, ISO).")
@click.option("--kind", type=click.Choice(["xid", "gpu_lost", "gpu_reset", "process_stall",
                                           "process_exit", "rule_finding"]))
@click.option("--state", type=click.Choice(["open", "acknowledged", "resolved", "active"]),
              help="Only incidents in this state (active: open or acknowledged).")
@click.option("--after", "after", type=click.IntRange(0, (1 << 63) - 1), metavar="CURSOR",
              help="The incident feed instead: every change after this cursor (0: all), "
                   "oldest first; --json prints JSON lines (the last one's cursor is the "
                   "next --after).")
@click.option("--limit", default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def incidents(ctx: click.Context, gpu: str | None, since_text: str | None,
              until_text: str | None, kind: str | None, state: str | None,
              after: int | None, limit: int, as_json: bool) -> None:
    """Incidents, newest first: Xids, resets, lost GPUs, stalls, deaths, rule findings.

    \b
    Examples:
      gpuwhy incidents --since 1d
      gpuwhy incidents --since 2026-12-03T01:00 --until 2026-12-03T03:00
      gpuwhy incidents --state active
      gpuwhy incidents --gpu 0000:18:00 --kind gpu_reset --json
      gpuwhy incidents --after 0 --json    # the feed (as /api/incidents?since=0)
    """
    from gpuwhy.store.queries import list_incidents

    if after is not None:
        if gpu or since_text or until_text or kind or state:
            raise click.UsageError("--after reads the whole feed: it takes no --gpu, --since, "
                                   "--until, --kind or --state")
        _feed(ctx, after, limit, as_json)
        return
    since = parse_since(since_text) if since_text else None
    until = parse_since(until_text) if until_text else None
    rows = _read(ctx, list_incidents, gpu=gpu, since=since, until=until, kind=kind,
                 state=state, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no incidents")
        return
    click.echo(table(
        ["id", "opened", "severity", "state", "kind", "GPU", "pid", "seen", "title"],
        [[row["id"], when(row["opened_at"]), row["severity"], row["state"], row["kind"],
          row["gpu_id"] or "?", row["pid"], row["count"] or 1, row["title"]] for row in rows],
        right=[0, 6, 7]))


def _feed(ctx: click.Context, after: int, limit: int, as_json: bool) -> None:
    """The incident feed after ``after`` (gpuwhy.store.feed), as JSON lines or a table."""
    from gpuwhy.store.feed import FEED_MAX, incident_changes

    changes = _read(ctx, incident_changes, after, max(1, min(limit, FEED_MAX)))
    if as_json:
        for change in changes:
            click.echo(json.dumps(change, separators=(",", ":")))
        return
    if not changes:
        click.echo(f"no changes after cursor {after}")
        return
    click.echo(table(
        ["cursor", "time", "action", "state", "id", "kind", "severity", "by", "title"],
        [[c["cursor"], when(c["ts"]), c["action"], c["state"], c["incident"]["id"],
          c["incident"]["kind"], c["incident"]["severity"], c["actor"] or "",
          c["incident"]["title"]] for c in changes], right=[0, 4]))
    click.echo(f"next: --after {changes[-1]['cursor']}")


def print_incident(detail: dict) -> None:
    """The incident as readable steps (shared by `gpuwhy incident` and `gpuwhy demo`)."""
    click.echo(f"Incident {detail['id']}: {printable(detail['title'])} "
               f"[{detail['severity']}, {detail['state']}]")
    state = detail["state"] or "-"
    if detail.get("resolution"):
        state += f" ({detail['resolution']})"
    if detail.get("acknowledged_by"):
        state += (f", acknowledged by {printable(detail['acknowledged_by'])} "
                  f"at {when(detail.get('acknowledged_at'))}")
    click.echo(f"  state    {state}")
    click.echo(f"  GPU      {detail['gpu'] or '?'}"
               + (f" (PCI {detail['gpu_pci']})" if detail["gpu_pci"] else ""))
    click.echo(f"  started  {when(detail['started'])}   ended {when(detail['ended'])}"
               + (f"   seen {detail['count']} times" if (detail["count"] or 1) > 1 else ""))
    click.echo(f"  summary  {printable(detail['summary'] or '')}")
    click.echo("  chain:")
    for n, link in enumerate(detail["chain"], 1):
        confidence = f"{link['confidence']:.0%}" if link["confidence"] is not None else "?"
        click.echo(f"   {n}. {when(link['ts'])}  {link['kind']:<16} "
                   f"{printable(link['summary'])}  (confidence {confidence})")
        if link["kind"] == "rule_finding":
            _print_finding(link["evidence"])
            continue
        evidence = {k: v for k, v in link["evidence"].items() if v not in (None, [], {})}
        if evidence:
            text = printable(json.dumps(evidence, sort_keys=True, default=str))
            click.echo(f"      evidence: {text[:300]}")
    if detail.get("log"):
        click.echo("  log:")
        for row in detail["log"]:
            how = f" ({row['resolution']})" if row.get("resolution") else ""
            text = f": {printable(row['text'])}" if row.get("text") else ""
            click.echo(f"   {when(row['ts'])}  {row['action']}{how} by "
                       f"{printable(row['actor'] or '?')}{text}")


def _print_finding(finding: dict) -> None:
    """A rule finding's rule, measured values, fixes and check, one per line."""
    click.echo(f"      rule      {printable(str(finding.get('rule_id', '?')))}"
               + (f" ({printable(finding['group'])})" if finding.get("group") else ""))
    measured = ", ".join(f"{printable(k)}={v:.4g}" if isinstance(v, float) else
                         f"{printable(k)}={printable(str(v))}"
                         for k, v in sorted((finding.get("evidence") or {}).items()))
    if measured:
        click.echo(f"      measured  {measured}")
    if finding.get("window_start"):
        click.echo(f"      held      since {when(finding.get('since'))}; evaluated over "
                   f"{when(finding['window_start'])} – {when(finding.get('window_end'))}")
    for n, fix in enumerate(finding.get("fixes") or [], 1):
        click.echo(f"      fix {n}     {printable(fix)}")
    if finding.get("verify"):
        click.echo(f"      verify    {printable(finding['verify'])}")


CHANGES = OPERATOR_CHANGES
_DONE = {"acknowledged": "acknowledged", "resolved": "resolved", "note": "noted"}


def default_actor() -> str:
    """Who is changing an incident: the user behind sudo, else the login name."""
    if os.environ.get("SUDO_USER"):
        return os.environ["SUDO_USER"]
    try:
        return getpass.getuser()
    except (OSError, KeyError):      # no name for this uid (a bare container)
        return f"uid {os.getuid()}"


def _not_writable(path: str, incident_id: int, why: object) -> click.ClickException:
    return click.ClickException(
        f"cannot change incident {incident_id}: the store {path} is not writable by "
        f"{default_actor()} ({why}). Run the command as the user gpuwhy runs as (e.g. with "
        "sudo), or change it in the web view with the token (GPUWHY_AUTH_TOKEN).")


def _is_read_only(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(words in text for words in ("readonly", "read-only", "unable to open",
                                           "permission denied", "read only"))


def change_incident(ctx: click.Context, incident_id: int, change: str, actor: str,
                    text: str | None) -> dict:
    """Acknowledge, resolve or note an incident in the store, then journal the change.
    Returns {id, action, state, resolution, log_id, journal (None or why not written)}."""
    from gpuwhy.store import incident_changes as store_lifecycle
    from gpuwhy.store import open_store

    config = ctx.obj.config()
    path = config["store.path"]
    if not os.path.exists(path):
        raise click.ClickException(f"no store at {path}: is gpuwhy running here? (the store "
                                   "is store.path, GPUWHY_DB)")
    if not os.access(path, os.W_OK):
        read_only_fs = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        raise _not_writable(path, incident_id, "it is on a read-only file system"
                            if read_only_fs else "no write permission")
    try:
        db = open_store(path)
    except GpuwhyError as exc:
        if _is_read_only(exc):
            raise _not_writable(path, incident_id, exc) from None
        raise click.ClickException(str(exc)) from None
    try:
        try:
            done = store_lifecycle.apply_change(db, incident_id, change, actor, text)
        except sqlite3.Error as exc:
            if _is_read_only(exc):
                raise _not_writable(path, incident_id, exc) from None
            raise click.ClickException(f"cannot change incident {incident_id} in the store "
                                       f"{path}: {exc}") from None
        except GpuwhyError as exc:    # IncidentNotFound, LifecycleError
            raise click.ClickException(str(exc)) from None
        try:
            unsent = store_lifecycle.send_change(db, cast(int, done["log_id"]),
                                                 config["correlator.url"])
        except Exception as exc:      # the change stands, whatever the journal does
            unsent = f"{type(exc).__name__}: {exc}"
    finally:
        db.close()
    return {**done, "journal": unsent}


@click.command()
@click.argument("incident_id", type=int)
@click.argument("change", required=False, type=click.Choice(CHANGES))
@click.argument("words", nargs=-1)
@click.option("--by", "actor", help="Who makes the change (default: $SUDO_USER, else your "
                                    "login name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def incident(ctx: click.Context, incident_id: int, change: str | None,
             words: tuple[str, ...], actor: str | None, as_json: bool) -> None:
    """One incident and its root-cause chain, step by step, with the evidence of each step;
    or change it: acknowledge it (you have it), resolve it, or add a note. Changes are kept
    in the incident's log and written to the journal.

    \b
    Examples:
      gpuwhy incident 12
      gpuwhy incident 12 --json | jq '.chain[].kind'
      gpuwhy incident 12 ack "draining the node"
      gpuwhy incident 12 note "RMA ticket 77" --by alice
      gpuwhy incident 12 resolve "GPU replaced"
    """
    from gpuwhy.store.queries import incident_detail

    if change is None:
        detail = _read(ctx, incident_detail, incident_id)
        if detail is None:
            raise click.ClickException(f"no incident {incident_id} (see `gpuwhy incidents`)")
        if as_json:
            click.echo(json.dumps(detail, indent=2, default=str))
        else:
            print_incident(detail)
        return
    actor = actor if actor is not None else default_actor()
    done = change_incident(ctx, incident_id, change, actor, " ".join(words) or None)
    if as_json:
        click.echo(json.dumps(done, indent=2))
    else:
        how = f" ({done['resolution']})" if done["action"] == "resolved" else ""
        click.echo(f"incident {incident_id} {_DONE.get(done['action'], done['action'])}{how} "
                   f"by {printable(actor.strip())}; it is {done['state']}")
    if done["journal"] is not None:
        click.echo(f"warning: the change is stored, but its journal entry was not written: "
                   f"{done['journal']}", err=True)


@click.command()
@click.option("--gpu", help="Only this GPU (index, UUID, PCI address or id).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def resets(ctx: click.Context, gpu: str | None, as_json: bool) -> None:
    """GPU reset history: when, by what or whom, which processes were hit.

    \b
    Examples:
      gpuwhy resets
      gpuwhy resets --gpu 0
      gpuwhy resets --gpu GPU-5f3c... --json
    """
    from gpuwhy.store.queries import reset_history

    history = _read(ctx, reset_history, gpu)
    if as_json:
        click.echo(json.dumps(history, indent=2))
        return
    if not history:
        click.echo("no GPU resets recorded")
    for reset in history:
        click.echo(f"{when(reset['at'])}  GPU {reset['gpu'] or '?'}  (incident {reset['id']}, "
                   f"seen by {printable(reset['seen_by'] or '?')})")
        for cause in reset["by"] or ["by: unknown (no reset command or job seen)"]:
            click.echo(f"    by  {printable(cause)}")
        for hit in reset["hit"]:
            click.echo(f"    hit pid {hit['pid']}: {hit['what']}: {printable(hit['summary'])}")
