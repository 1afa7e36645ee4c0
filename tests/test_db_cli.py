"""`gpuwhy db info|prune|rollup|check|schema` on real stores."""

import json
from pathlib import Path

from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.demo.synthetic_store import Plan, fill
from gpuwhy.clock import now_ns
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

SCHEMA_PAGE = Path(__file__).resolve().parent.parent / "docs" / "schema.md"


def _invoke(args, path, **env):
    return CliRunner().invoke(cli, ["db", *args], env={"GPUWHY_DB": str(path), **env})


def _store(tmp_path, days=0.1):
    path = tmp_path / "gpuwhy.db"
    db = open_store(path)
    fill(db, Plan(gpus=2, days=days, interval=10.0, start_ns=now_ns() - int(days * 86400e9)))
    db.close()
    return path


def test_info_check_rollup_prune_on_a_filled_store(tmp_path):
    path = _store(tmp_path, days=0.5)
    result = _invoke(["rollup"], path)
    assert result.exit_code == 0, result.output
    minutes = int(result.output.split()[0])
    assert 700 <= minutes <= 720
    info = json.loads(_invoke(["info", "--json"], path).output)
    assert info["size"]["state"] == "ok" and info["tables"]["gpu_sample_data"] == 2 * 4320
    assert info["tables"]["gpu_rollup_data"] == 2 * minutes
    assert info["rollups"]["done_until"] >= info["raw_samples"]["from"]
    text = _invoke(["info"], path).output
    assert "MB used of a 10240 MB cap" in text and "gpu_rollup_data" in text
    assert _invoke(["check"], path).exit_code == 0
    result = _invoke(["prune"], path, GPUWHY_RAW_DAYS="0.25")
    assert result.exit_code == 0, result.output
    assert "gpu_sample_data" in result.output and "longest batch" in result.output
    info = json.loads(_invoke(["info", "--json"], path).output)
    assert 2 * 4320 * 0.45 < info["tables"]["gpu_sample_data"] < 2 * 4320 * 0.55


def test_check_fails_on_a_store_over_its_cap(tmp_path):
    path = _store(tmp_path)
    result = _invoke(["check"], path, GPUWHY_STORE_MAX_MB="0.1")
    assert result.exit_code == 1
    assert "size over" in result.output


def test_prune_refuses_while_the_service_writes(tmp_path):
    path = tmp_path / "gpuwhy.db"
    db = open_store(path)
    StoreWriter(db).record_health("correlator", "ok", "", {}, now_ns())
    db.close()
    result = _invoke(["prune"], path)
    assert result.exit_code == 1 and "service is writing this store" in result.output
    assert _invoke(["prune", "--force"], path).exit_code == 0


def test_info_on_a_missing_store_says_so(tmp_path):
    result = _invoke(["info"], tmp_path / "nope.db")
    assert result.exit_code == 2 and "no store at" in result.output


def test_schema_lists_views_and_checks_the_page(tmp_path):
    result = _invoke(["schema"], tmp_path / "x.db")
    assert result.exit_code == 0 and "gpu_reset_history (view)" in result.output
    assert _invoke(["schema", "--check", str(SCHEMA_PAGE)], tmp_path / "x.db").exit_code == 0
    stale = tmp_path / "stale.md"
    stale.write_text("### `gpu_samples` (view)\n\nold\n")
    result = _invoke(["schema", "--check", str(stale)], tmp_path / "x.db")
    assert result.exit_code == 1 and "stale" in result.output


def _newer(path):
    """A store a newer gpuwhy has migrated: one schema step this build does not know."""
    db = open_store(path)
    db["_sqlite_migrations"].insert({"migration_set": "gpuwhy", "name": "m999_from_the_future",
                                     "applied_at": "2027-01-01 00:00:00+00:00"})
    db.close()
    return path


def test_a_store_with_a_zeroed_header_is_a_clear_error_not_a_traceback(tmp_path):
    path = tmp_path / "zero.db"
    path.write_bytes(bytes(4096))
    check = _invoke(["check"], path)
    assert (check.exit_code, check.output) == (
        1, f"integrity FAILED: cannot read store {path}: file is not a database\n")
    for args in (["info"], ["info", "--json"], ["prune"], ["rollup"]):
        result = _invoke(args, path)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), args
        assert "file is not a database" in result.output, args


def test_a_store_from_a_newer_gpuwhy_is_refused_and_checked(tmp_path):
    path = _newer(tmp_path / "gpuwhy.db")
    for args in (["info"], ["prune", "--force"], ["rollup", "--force"]):
        result = _invoke(args, path)
        assert result.exit_code == 2, (args, result.output)
        assert f"store {path} was written by a newer gpuwhy" in result.output
        assert "m999_from_the_future" in result.output
    check = _invoke(["check"], path)
    assert check.exit_code == 1 and "written by a newer gpuwhy" in check.output
