"""Print an HTML file to PDF with headless Chromium (a fresh profile, no network needed)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from gpuwhy.errors import GpuwhyError


class PdfError(GpuwhyError):
    """Chromium is missing, failed, or wrote no PDF."""


def render_pdf(html: Path, pdf: Path, chromium: str = "/usr/bin/chromium",
               timeout: float = 60.0) -> None:
    """Print ``html`` to ``pdf``; raises :class:`PdfError` with Chromium's last words."""
    if shutil.which(chromium) is None:
        raise PdfError(f"no Chromium at {chromium} (checks.chromium): install Debian's "
                       "chromium package, or write HTML only")
    pdf = pdf.resolve()
    pdf.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuwhy-chromium-") as profile:
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                   "--no-pdf-header-footer", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", "--no-first-run",
                   f"--user-data-dir={profile}", f"--print-to-pdf={pdf}",
                   html.resolve().as_uri()]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PdfError(f"Chromium took more than {timeout:.0f}s to print {html}") from None
        except OSError as exc:
            raise PdfError(f"cannot run {chromium}: {exc.strerror}") from None
    if not pdf.exists() or pdf.read_bytes()[:5] != b"%PDF-":
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise PdfError(f"Chromium wrote no PDF (exit status {done.returncode}): {tail}")
