"""Keeps the store's copy of the Xid catalogue (``xid_codes``, which the views join) equal to
the catalogue this build knows (:mod:`gpuwhy.xid`).

The catalogue changes with gpuwhy, not with the store: a table written once by a migration
kept the 55 codes of the build that created the store after gpuwhy learnt all 172. At every
writable open the catalogue's fingerprint is compared with the one stored in
``store_state``; only a new one rewrites the table (172 rows, a few milliseconds).
"""

from __future__ import annotations

import json
import zlib

from sqlite_utils import Database

from gpuwhy.clock import now_ns
from gpuwhy.xid import documented_codes, xid_info

FINGERPRINT = "xid_catalogue_crc32"


def catalogue_rows() -> list[dict[str, object]]:
    """One row per code the catalogue documents, as the table keeps it."""
    rows = []
    for code in documented_codes():
        x = xid_info(code)
        rows.append({"code": x.code, "mnemonic": x.mnemonic, "title": x.title,
                     "severity": x.severity, "origin": x.origin,
                     "gpu_reset": int(x.gpu_reset), "reboot": int(x.reboot),
                     "immediate": x.immediate, "investigatory": x.investigatory})
    return rows


def sync_xid_codes(db: Database) -> bool:
    """Rewrite ``xid_codes`` when this build's catalogue differs from the one stored;
    True when it did. Runs inside the caller's open, after the migrations."""
    if not db["xid_codes"].exists() or not db["store_state"].exists():
        return False
    rows = catalogue_rows()
    crc = zlib.crc32(json.dumps(rows, sort_keys=True).encode())
    stored = db.execute("SELECT value FROM store_state WHERE name = ?",
                        [FINGERPRINT]).fetchone()
    if stored is not None and stored[0] == crc:
        return False
    with db.conn:
        db.execute("DELETE FROM xid_codes")
        db.table("xid_codes").insert_all(rows, pk="code", alter=True)
        db.execute("INSERT INTO store_state (name, value, updated_at) VALUES (?, ?, ?) "
                   "ON CONFLICT (name) DO UPDATE SET value = excluded.value, "
                   "updated_at = excluded.updated_at", [FINGERPRINT, crc, now_ns()])
    return True
