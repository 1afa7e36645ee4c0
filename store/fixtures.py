"""Rows the demo harness writes straight into a store, as the correlator would have
(SIMULATED: ``gpuwhy.app.demo.synthetic_store``): incident links, and the stored event an
incident's evidence points at. The incidents themselves go through
:func:`gpuwhy.store.incident_rows.insert_incident`, as the correlator's do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlite_utils import Database


def xid_event_at(db: Database, ts: int) -> int | None:
    """The id of a stored ``gpu_xid`` event at exactly ``ts`` (ns), or None."""
    row = db.execute("SELECT id FROM events WHERE kind = 'gpu_xid' AND ts = ?", [ts]).fetchone()
    return row[0] if row else None


def insert_links(db: Database, links: Sequence[Mapping[str, Any]]) -> None:
    """Add ``incident_links`` rows as given (incident_id, seq, kind, ts, summary, evidence as
    JSON text, confidence, gpu_id, ...); unlike
    :func:`gpuwhy.store.incident_chains.store_chain` it neither replaces an incident's links
    nor notes its chain."""
    db.table("incident_links").insert_all([dict(link) for link in links])
