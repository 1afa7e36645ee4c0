"""`gpuwhy incidents`, `gpuwhy incident ID`, `gpuwhy resets`: incidents and their chains."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.text import format_ts as when
from gpuwhy.text import printable

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])\Z")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> int:
    """``10m``/``2h``/``1d`` ago, or an ISO date-time (local time if no zone), as realtime ns."""
    match = _DURATION.match(text.strip())
    if match:
        return now_ns() - int(float(match[1]) * _UNIT[match[2]] * NS_PER_SECOND)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: use 30s, 10m, 2h, 1d or an ISO date-time") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * NS_PER_SECOND)




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
    finally:
        db.close()


@click.command()
@click.option("--gpu", help="Only this GPU (id, UUID or PCI address).")
@click.option("--since", "since_text", help="Only incidents seen since (30s, 10m, 2h, 1d, ISO).")
@click.option("--kind", type=click.Choice(["xid", "gpu_lost", "gpu_reset", "process_stall",
                                           "process_exit", "rule_finding"]))
@click.option("--limit", default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def incidents(ctx: click.Context, gpu: str | None, since_text: str | None, kind: str | None,
              limit: int, as_json: bool) -> None:
    """Incidents, newest first: Xids, resets, lost GPUs, stalls, deaths, rule findings.

    \b
    Examples:
      gpuwhy incidents --since 1d
      gpuwhy incidents --gpu 0000:18:00 --kind gpu_reset --json
    """
    from gpuwhy.store.queries import list_incidents

    since = parse_since(since_text) if since_text else None
    rows = _read(ctx, list_incidents, gpu=gpu, since=since, kind=kind, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no incidents")
        return
    for row in rows:
        count = f" ×{row['count']}" if (row["count"] or 1) > 1 else ""
        pid = f" pid {row['pid']}" if row["pid"] is not None else ""
        click.echo(f"{row['id']:>6}  {when(row['opened_at'])}  {row['severity']:<8} "
                   f"{row['state'] or '-':<6} {row['kind']:<13} GPU {row['gpu_id'] or '?'}{pid}"
                   f"  {printable(row['title'])}{count}")


def print_incident(detail: dict) -> None:
    """The incident as readable steps (shared by `gpuwhy incident` and `gpuwhy demo`)."""
    click.echo(f"Incident {detail['id']}: {printable(detail['title'])} "
               f"[{detail['severity']}, {detail['state']}]")
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


def _print_finding(finding: dict) -> None:
    """A rule finding's rule, measured values, fixes and check, one per line."""
    click.echo(f"      rule      {printable(str(finding.get('rule_id', '?')))}"
               + (f" ({printable(finding['group'])})" if finding.get("group") else ""))
    measured = ", ".join(f"{printable(k)}={v:.4g}" if isinstance(v, float) else
                         f"{printable(k)}={printable(str(v))}"
                         for k, v in sorted((finding.get("evidence") or {}).items()))
    if measured:
        click.echo(f"      measured  {measured}")
    for n, fix in enumerate(finding.get("fixes") or [], 1):
        click.echo(f"      fix {n}     {printable(fix)}")
    if finding.get("verify"):
        click.echo(f"      verify    {printable(finding['verify'])}")


@click.command()
@click.argument("incident_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def incident(ctx: click.Context, incident_id: int, as_json: bool) -> None:
    """One incident and its root-cause chain, step by step, with the evidence of each step.

    \b
    Examples:
      gpuwhy incident 12
      gpuwhy incident 12 --json | jq '.chain[].kind'
    """
    from gpuwhy.store.queries import incident_detail

    detail = _read(ctx, incident_detail, incident_id)
    if detail is None:
        raise click.ClickException(f"no incident {incident_id} (see `gpuwhy incidents`)")
    if as_json:
        click.echo(json.dumps(detail, indent=2, default=str))
    else:
        print_incident(detail)


@click.command()
@click.option("--gpu", help="Only this GPU (id, UUID or PCI address).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def resets(ctx: click.Context, gpu: str | None, as_json: bool) -> None:
    """GPU reset history: when, by what or whom, which processes were hit.

    \b
    Examples:
      gpuwhy resets
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
