"""The store's Xid catalogue (xid_codes, which the views join) follows this build's."""

from __future__ import annotations

from gpuwhy.store import open_store
from gpuwhy.store.xid_codes import sync_xid_codes
from gpuwhy.xid import documented_codes, xid_info


def test_a_store_written_by_an_older_build_gets_the_whole_catalogue(tmp_path):
    path = tmp_path / "g.db"
    db = open_store(path)
    assert db.execute("SELECT count(*) FROM xid_codes").fetchone()[0] == len(documented_codes())
    # as a store created before gpuwhy knew every code: 55 rows, an old 156 level
    db.execute("DELETE FROM xid_codes WHERE code > 150")
    db.execute("UPDATE xid_codes SET severity = 'warning' WHERE code = 48")
    db.execute("DELETE FROM store_state WHERE name = 'xid_catalogue_crc32'")
    db.conn.commit()
    db.close()
    db = open_store(path)
    rows = {r[0]: r[1:] for r in db.execute(
        "SELECT code, severity, immediate, gpu_reset, reboot FROM xid_codes")}
    assert set(rows) == set(documented_codes())
    info = xid_info(79)
    assert rows[79] == (info.severity, info.immediate, int(info.gpu_reset), int(info.reboot))
    assert rows[48][0] == xid_info(48).severity
    assert not sync_xid_codes(db)         # the same catalogue is not written again
    db.close()


def test_the_views_read_the_new_codes(tmp_path):
    db = open_store(tmp_path / "g.db")
    # a code gpuwhy called unknown before it knew the whole catalogue
    [(title,)] = db.execute("SELECT title FROM xid_codes WHERE code = 11").fetchall()
    assert title == xid_info(11).title and "nknown" not in title
    db.close()
