"""A store with corrupt pages is found out: SQLite's quick check runs at the maintenance's
first step and daily after, and a failed one makes the store's health ``failed``."""

import time

from gpuwhy.config import load_config
from gpuwhy.store import open_store
from gpuwhy.store.maintenance import INTEGRITY_EVERY_S, Maintenance, quick_check

PAGE = 4096


def _store_with_a_table(path):
    db = open_store(path)
    db["notes"].insert_all({"n": i, "text": "x" * 200} for i in range(2000))
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'notes'").fetchone()[0]
    assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE
    db.close()                   # the last connection checkpoints the WAL into the file
    return root


def _config(path):
    return load_config(environ={"GPUWHY_DB": str(path)})


def test_a_sound_store_passes_once_at_start_then_daily(tmp_path):
    path = tmp_path / "gpuwhy.db"
    _store_with_a_table(path)
    db = open_store(path)
    maintenance = Maintenance(_config(path), db)
    maintenance.step()
    maintenance.step()
    state, detail, counters = maintenance.health()
    assert state == "ok" and counters["integrity_checks"] == 1, detail
    assert maintenance.next_integrity - time.monotonic() > INTEGRITY_EVERY_S - 60
    maintenance.next_integrity = 0.0           # a day later
    maintenance.step()
    assert maintenance.health()[2]["integrity_checks"] == 2
    db.close()


def test_corrupt_pages_make_the_store_failed(tmp_path):
    path = tmp_path / "gpuwhy.db"
    root = _store_with_a_table(path)
    with open(path, "r+b") as file:             # a b-tree page's header overwritten
        file.seek((root - 1) * PAGE)
        file.write(b"\xff" * 64)
    db = open_store(path)                       # it opens, and runs, as before
    assert db["gpus"].count == 0
    maintenance = Maintenance(_config(path), db)
    maintenance.step()
    state, detail, counters = maintenance.health()
    assert state == "failed" and counters["integrity_checks"] == 1
    assert detail.startswith(f"integrity check failed: Page {root}: ")
    assert "gpuwhy db check" in detail
    assert quick_check(db) and len(quick_check(db)) <= 20
    db.close()
