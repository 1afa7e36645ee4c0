"""`gpuwhy cron`: the cron and systemd-timer schedule, with next/last runs and GPU actions."""

from __future__ import annotations

import json
from datetime import datetime

import click

from gpuwhy.probes.klog.cli import printable


def _when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one object per job.")
@click.option("--gpu", "gpu_only", is_flag=True, help="Only jobs that act on GPUs.")
@click.pass_obj
def cron(ctx: object, as_json: bool, gpu_only: bool) -> None:
    """The cron and systemd-timer schedule of this host; jobs that act on GPUs are flagged.

    Reads /etc/crontab, /etc/cron.d/*, the users' crontabs and systemd timer units
    (settings cron.etc, cron.spool, cron.unit_dirs).

    \b
    Examples:
      gpuwhy cron
      gpuwhy cron --gpu --json | jq -r '.command'
    """
    from gpuwhy.probes.cron.source import read_schedule

    jobs = read_schedule(ctx.config())    # type: ignore[attr-defined]
    if gpu_only:
        jobs = [job for job in jobs if job.gpu_action]
    for job in jobs:
        if as_json:
            click.echo(json.dumps(vars(job)))
            continue
        flag = f"  !! GPU: {job.gpu_action}" if job.gpu_action else ""
        note = f"  ({job.note})" if job.note else ""
        click.echo(f"{job.origin:<7} {printable(job.schedule):<22} {job.user:<8} "
                   f"next {_when(job.next_run)}  last {_when(job.last_run)}  "
                   f"{printable(job.command)}{flag}{note}")
