import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    result = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_benchmarks_md_stays_a_reference_and_records_stay_a_page():
    """BENCHMARKS.md is the reference for the current figures, under 400 lines (#55); what
    was tried goes into a decision record of about a page each."""
    assert len((REPO / "BENCHMARKS.md").read_text().splitlines()) < 400
    long = {p.name: n for p in (REPO / "docs" / "decisions").glob("0*.md")
            if (n := len(p.read_text().splitlines())) > 120}
    assert long == {}
