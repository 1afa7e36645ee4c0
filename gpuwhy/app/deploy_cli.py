"""`gpuwhy check-env`: can this host run gpuwhy, and what fixes what is missing."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpuwhy.app.deploy.checkenv import Host, render, report, run_checks


@click.command("check-env")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def check_env(ctx: Any, as_json: bool) -> None:
    """Check the NVIDIA driver, DCGM, NVML, BTF, kernel headers, tracefs, BPF, Python and disk.

    Each failure comes with the command that fixes it on Debian, Ubuntu and RHEL-family
    hosts; exit status 1 when anything failed.

    \b
    Examples:
      sudo gpuwhy check-env
      gpuwhy check-env --json | jq '.checks[] | select(.state != "ok")'
    """
    host = Host(config=ctx.config())
    result = report(host, run_checks(host))
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
    sys.exit(0 if result["ok"] else 1)
