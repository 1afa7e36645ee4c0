"""`gpuwhy report`: write the HTML (and optionally PDF) report of an incident, GPU or process."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import cast

import click

from gpuwhy.app.checks.watch import EnvironmentProblem
from gpuwhy.app.clitypes import OutputFile
from gpuwhy.clock import now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.identity import ProcessKey


def _process_key(ctx: click.Context, param: click.Parameter, value: str | None
                 ) -> ProcessKey | None:
    if value is None:
        return None
    try:
        return ProcessKey.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.option("--incident", "incident_id", type=int, help="Report on this incident.")
@click.option("--gpu", help="Report on this GPU (id, UUID, PCI address or index).")
@click.option("--since", "since_text", default="24h", show_default=True,
              help="With --gpu: the period (30m, 72h, 7d or an ISO date-time).")
@click.option("--process", "process", callback=_process_key, metavar="PID-START",
              help="Report on this process (its key, as `gpuwhy incidents` shows it).")
@click.option("--compare", is_flag=True,
              help="Compare the figures with the period of the same length just before.")
@click.option("-o", "--output", type=OutputFile(),
              help="HTML file to write [default: gpuwhy-report-<subject>.html].")
@click.option("--pdf", "pdf_path", is_flag=False, flag_value="", default=None,
              metavar="[FILE]", help="Also print it to PDF with headless Chromium "
                                     "(FILE, or the HTML file's name with .pdf).")
@click.pass_context
def report(ctx: click.Context, incident_id: int | None, gpu: str | None, since_text: str,
           process: ProcessKey | None, compare: bool, output: str | None,
           pdf_path: str | None) -> None:
    """Write one self-contained HTML report (charts as inline SVG, works offline).

    It holds the environment, metric trends with the incidents marked, the incidents and
    their root-cause chains, rule findings with their fixes in priority order, and with
    --compare the change against the period before. Exactly one of --incident, --gpu or
    --process.

    \b
    Examples:
      gpuwhy report --incident 12 --pdf
      gpuwhy report --gpu 0000:18:00.0 --since 72h --compare -o gpu18.html
      gpuwhy report --process 4242-1000 -o job.html
    """
    # the renderers load the web view's package (Flask, Jinja): only when a report is made
    from gpuwhy.app.incidents_cli import parse_since
    from gpuwhy.store import open_store
    from gpuwhy.webui.reports.pdf import render_pdf
    from gpuwhy.webui.reports.report import (
        gather,
        gpu_subject,
        incident_subject,
        process_subject,
        render,
    )

    chosen = [x is not None for x in (incident_id, gpu, process)]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --incident ID, --gpu ID, --process PID-START")
    config = ctx.obj.config()
    try:
        db = open_store(config["store.path"], readonly=True)
    except GpuwhyError as exc:
        raise EnvironmentProblem(str(exc)) from None
    with contextlib.closing(db):
        try:
            if incident_id is not None:
                subject, name = incident_subject(db, incident_id), f"incident-{incident_id}"
            elif gpu is not None:
                subject = gpu_subject(db, gpu, parse_since(since_text), now_ns())
                name = "gpu-" + "".join(c if c.isalnum() else "-" for c in subject.gpu_ids[0])
            else:
                # exactly one of the three was given: this one
                subject = process_subject(db, cast(ProcessKey, process))
                name = f"process-{process}"
            html = render(gather(db, subject, compare))
        except GpuwhyError as exc:
            raise EnvironmentProblem(str(exc)) from None
    target = Path(output or f"gpuwhy-report-{name}.html")
    target.write_text(html, encoding="utf-8")
    click.echo(f"wrote {target} ({len(html.encode()) // 1024} KiB)")
    if pdf_path is not None:
        pdf = Path(pdf_path) if pdf_path else target.with_suffix(".pdf")
        try:
            render_pdf(target, pdf, config["checks.chromium"], config["checks.pdf_timeout"])
        except GpuwhyError as exc:
            raise EnvironmentProblem(str(exc)) from None
        click.echo(f"wrote {pdf} ({pdf.stat().st_size // 1024} KiB)")
