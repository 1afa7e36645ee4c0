"""`gpuwhy report` on the web tests' scenario (built through the real correlator): the
cron-reset incident's chain and charts in one self-contained HTML file, every process-
controlled string escaped, GPU and process reports, and the PDF Chromium prints of it."""

import re
import subprocess

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli

from .conftest import EVIL_NAME, TRAIN

CHAIN = ["cron_job", "command", "driver_call", "gpu_reset", "process_stall"]   # the trainer stalled


def _run(scenario, *args):
    return CliRunner().invoke(cli, list(args), env={"GPUWHY_DB": str(scenario.path),
                                                    "GPUWHY_CONFIG": None})


def _reset_incident(scenario) -> int:
    import sqlite3

    with sqlite3.connect(scenario.path) as db:
        return db.execute("select id from incidents where kind = 'gpu_reset'").fetchone()[0]


@pytest.fixture(scope="module")
def incident_report(scenario, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "reset.html"
    result = _run(scenario, "report", "--incident", str(_reset_incident(scenario)), "-o",
                  str(out), "--pdf")
    assert result.exit_code == 0, result.output
    return out, out.read_text(encoding="utf-8")


def test_incident_report_holds_the_chain_in_order(scenario, incident_report):
    _, html = incident_report
    first = html.index('id="incident-')
    kinds = re.findall(r'<li data-kind="([a-z_]+)"', html[first:html.index("</ol>", first)])
    assert kinds == CHAIN
    assert "NV0080_CTRL_CMD_BIF_RESET" in html
    assert "cron ran `nvidia-smi -r -i 0` as root" in html
    assert "Find what asked for the reset" in html            # the recommended action
    assert scenario.gpu_ids[0] in html and "SIMULATED" in html


def test_incident_report_has_inline_charts_and_nothing_external(incident_report):
    _, html = incident_report
    charts = re.findall(r"<svg .*?</svg>", html, re.S)
    flames = [c for c in charts if 'class="flame"' in c]       # the R02 incident's stacks
    assert len(charts) - len(flames) == 5 and len(flames) == 1
    assert 'class="marker"' not in flames[0]
    engine = next(c for c in charts if "Engine activity" in c)
    assert engine.count("<polyline") >= 4                      # util, SM, tensor, DRAM
    assert 'class="marker"' in engine                          # the incident, marked
    assert "<script" not in html.lower()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<link" not in html


def test_process_controlled_text_is_escaped(incident_report):
    _, html = incident_report
    assert EVIL_NAME not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<i>(test)</i>" not in html                         # a finding's title
    assert "alert(3)" in html and "<script>alert(3)" not in html


def test_findings_come_with_their_fixes(scenario, incident_report):
    _, html = incident_report
    findings = html[html.index('id="findings"'):html.index('id="trends"')]
    assert "Input pipeline starves the GPU" in findings
    assert findings.index("Raise num_workers") < findings.index("Use pin_memory=True")
    # its evidence as on the incident page: names and values with units, not JSON
    assert re.search(r'<tr data-key="gpu_idle_share"><th>GPU idle share</th><td>55%</td>',
                     findings)


def test_the_chains_evidence_reads_as_on_the_incident_page_without_links(incident_report):
    _, html = incident_report
    first = html.index('id="incident-')
    chain = html[first:html.index("</ol>", first)]
    assert '<table class="evidence">' in chain and "cron runs" in chain
    assert "[&#34;" not in chain and '{"' not in chain and "&#34;" not in chain
    assert "<a " not in chain                      # the report leaves the server: no links


def test_pdf_renders_with_the_chain(incident_report):
    html_path, _ = incident_report
    pdf = html_path.with_suffix(".pdf")
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True)
    pages = int(re.search(r"^Pages:\s+(\d+)", info.stdout, re.M)[1])
    assert 2 <= pages <= 10
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    assert "Root-cause chain" in text and "NV0080_CTRL_CMD_BIF_RESET" in text
    assert "Engine activity" in text                           # chart titles are text too


def test_gpu_report_with_comparison(scenario, tmp_path):
    out = tmp_path / "gpu.html"
    result = _run(scenario, "report", "--gpu", scenario.gpu_ids[1], "--since", "2h",
                  "--compare", "-o", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Xid 13: Graphics engine exception" in html and "mean before" in html
    assert "&lt;b&gt;bold&lt;/b&gt;&lt;script&gt;" in html           # the kernel-log line
    assert "<script" not in html.lower()


def test_process_report(scenario, tmp_path):
    out = tmp_path / "process.html"
    result = _run(scenario, "report", "--process", str(TRAIN), "-o", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Process threads, per second" in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html         # its command line
    assert "GPU reset" in html                                     # its incidents


@pytest.mark.parametrize("args, words", [
    (["--incident", "999999"], "no incident 999999"),
    (["--gpu", "GPU-nope"], "no GPU 'GPU-nope'"),
    (["--process", "1-1"], "no process 1-1"),
])
def test_unknown_subjects_exit_2(scenario, args, words, tmp_path):
    result = _run(scenario, "report", *args, "-o", str(tmp_path / "x.html"))
    assert result.exit_code == 2 and words in result.output
    assert not (tmp_path / "x.html").exists()
