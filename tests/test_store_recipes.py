"""The README's database recipes run verbatim (sqlite3 and sqlite-utils, real CLIs) on a
store filled by the GPU simulator and the store writer; docs/schema.md matches the schema."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.app.demo.synthetic_store import Plan, fill
from gpuwhy.store import open_store
from gpuwhy.store.schema_doc import STORE_OBJECTS, check_page, fresh_schema, sections
from gpuwhy.store.views import VIEWS_V1

REPO = Path(__file__).resolve().parent.parent


def readme_recipes() -> tuple[str, list[str]]:
    """(the DB= line, each recipe command) of the README's "Asking the database" block."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Asking the database yourself"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert lines[0].startswith("DB=")
    return lines[0], lines[1:]


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipes") / "gpuwhy.db"
    db = open_store(path)
    stats = fill(db, Plan(gpus=2, days=1.2, interval=5.0))
    from gpuwhy.store.rollups import roll_up
    while roll_up(db, 1_767_225_600 * 10**9 + 2 * 86_400 * 10**9, max_minutes=500):
        pass
    db.close()
    assert stats.incidents == 2
    return path


def _run(command: str, db_line: str, db_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUWHY_DB": str(db_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", f"set -eo pipefail\n{db_line}\n{command}"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


_DB_LINE, _RECIPES = readme_recipes()


@pytest.mark.parametrize("command", _RECIPES, ids=[c.split('"')[3][:40] for c in _RECIPES])
def test_readme_recipe_runs_verbatim(command, filled_store, tmp_path):
    result = _run(command, _DB_LINE, filled_store, tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines()
            if line.strip() and not set(line) <= set("-+|─│┌┐└┘├┤┬┴┼ ")]
    assert len(rows) >= 2, f"no rows from {command}:\n{result.stdout}"   # header + data
    assert "Error" not in result.stderr


def test_recipes_cover_every_view():
    used = " ".join(_RECIPES)
    assert [name for name in VIEWS_V1 if name not in used] == []


def test_schema_page_matches_the_live_schema():
    page = (REPO / "docs" / "schema.md").read_text()
    live = fresh_schema()
    assert check_page(page, live) == []
    documented = sections(page)
    assert set(STORE_OBJECTS) <= set(documented)


def test_schema_check_catches_a_changed_view_and_a_vanished_table():
    live = fresh_schema()
    changed = live.replace("| gpu_util_p95 |", "| gpu_util_p99 |")
    assert any(p.startswith("gpu_rollups:") for p in check_page(changed, live))
    extra = live + "\n### `no_such_table` (table)\n\nGone.\n"
    assert check_page(extra, live) == ["no_such_table: documented but not in the schema"]
    new_table_elsewhere = live.replace("### `cron_jobs` (table)", "### `cron_jobs_x` (table)")
    assert check_page(new_table_elsewhere, live) == [
        "cron_jobs: in the schema but not documented (regenerate the page)",
        "cron_jobs_x: documented but not in the schema"]
    added_column = live.replace("| cmdline | TEXT |", "| cmdline | TEXT |\n| new | TEXT |", 1)
    assert [p.split(":")[0] for p in check_page(live, added_column)] == ["processes"]


def test_views_answer_the_questions_on_simulated_days(filled_store):
    db = open_store(filled_store, readonly=True)
    resets = db.execute("SELECT what, source FROM gpu_reset_history ORDER BY ts").fetchall()
    assert ("driver call NV0080_CTRL_CMD_BIF_RESET", "driver call") in resets
    assert ("cron: nvidia-smi -r: GPU reset", "cron") in resets
    assert ("xid 79", "kernel log") in resets and ("gpu back", "gpu source") in resets
    chain = db.execute("SELECT step, kind FROM incident_chains WHERE incident_id = 1 "
                       "ORDER BY step").fetchall()
    assert chain == [(1, "xid"), (2, "cron_job"), (3, "driver_call"), (4, "gpu_reset")]
    xids = db.execute("SELECT day, xid, count, kernel_log_count, gpu_source_count "
                      "FROM xids_per_gpu_day ORDER BY day").fetchall()
    assert xids == [("2026-01-01", 79, 1, 1, 1), ("2026-01-02", 79, 1, 1, 1)]
    # every second of the 1.2 days is held by exactly one job per GPU
    total = db.execute("SELECT sum(gpu_seconds) FROM gpu_time_by_tag").fetchone()[0]
    assert total == pytest.approx(2 * 1.2 * 86_400, abs=5)
    key = db.execute("SELECT pid, start_time, gpu_id FROM gpu_time_by_process LIMIT 1"
                     ).fetchone()
    since, until = db.execute("SELECT since, until FROM gpu_bindings WHERE pid = ? AND "
                              "start_time = ?", key[:2]).fetchone()
    timeline = db.execute("SELECT min(ts), max(ts), count(*) FROM process_gpu_timeline "
                          "WHERE pid = ? AND start_time = ?", key[:2]).fetchone()
    assert since <= timeline[0] and timeline[1] < until and timeline[2] > 1000
    db.close()
