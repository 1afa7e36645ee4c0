"""`gpuwhy cron`: the cron and systemd-timer schedule, with next/last runs and GPU actions."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuwhy.text import format_ts, table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one object per job.")
@click.option("--gpu", "gpu_only", is_flag=True, help="Only jobs that act on GPUs.")
@click.pass_obj
def cron(ctx: Any, as_json: bool, gpu_only: bool) -> None:
    """The cron and systemd-timer schedule of this host; jobs that act on GPUs are flagged.

    Reads /etc/crontab, /etc/cron.d/*, the users' crontabs and systemd timer units
    (settings cron.etc, cron.spool, cron.unit_dirs).

    \b
    Examples:
      gpuwhy cron
      gpuwhy cron --gpu --json | jq -r '.command'
    """
    from gpuwhy.probes.cron.reread import read_schedule

    jobs = read_schedule(ctx.config())
    if gpu_only:
        jobs = [job for job in jobs if job.gpu_action]
    if as_json:
        for job in jobs:
            click.echo(json.dumps(vars(job)))
        return
    if not jobs:
        click.echo("no GPU jobs scheduled" if gpu_only else "no cron jobs or timers found")
        return
    click.echo(table(
        ["from", "schedule", "user", "next", "last", "command"],
        [[job.origin, job.schedule, job.user, format_ts(job.next_run, "min"),
          format_ts(job.last_run, "min"),
          job.command + (f"  !! GPU: {job.gpu_action}" if job.gpu_action else "")
          + (f"  ({job.note})" if job.note else "")] for job in jobs]))
