"""GPU identity in the store: every name a GPU goes by, the rows moved to its strongest id,
and any name resolved to that id.

The keys themselves (what ``uuid:…``, ``pci:…``, ``index:N``, ``minor:N`` and a GPU's id are)
are core: :class:`gpuwhy.identity.GpuIdentity`. This module is the one place that keeps them:
``gpu_aliases`` maps every alias to its GPU's id, ``gpu_pci_uuids`` the PCI addresses the
kernel log paired with a UUID. When a source first names a GPU by a weaker name (a device
file opened before the GPU source said which UUID has minor 0), the rows stored under the
weaker id are re-keyed once the strong one is known (:func:`learn`). The decide stage only
says which identities it saw; the writer and the decide stage resolve names here
(:func:`resolve_gpu`), and so do the read API's ``gpu_named`` (a person's ``--gpu``) and
``pci_and_uuid`` (what alerts name a GPU by), which ``gpuwhy.store.queries`` offers.
"""

from __future__ import annotations

from sqlite_utils import Database

from gpuwhy.identity import GpuIdentity, normalize_pci

# Tables whose gpu_id column is re-keyed when a GPU's stronger id becomes known.
GPU_ID_TABLES = ("gpu_bindings", "events", "kernel_log", "incidents", "incident_links",
                 "process_seconds", "gpu_health_history")


def learn(db: Database, identity: GpuIdentity, ts: int) -> str:
    """Record every alias of ``identity`` and move rows stored under its weaker ids to its id.

    Rows get a weaker id only while the store cannot name the GPU better: once every alias
    leads to this id, writers store it, and a weaker id comes back only with a GPU row of
    its own (a device file opened where no GPU row has its minor). So when the aliases were
    all known already and no GPU row holds a weaker id, there is nothing to move, and the
    re-keying is skipped: three of its tables have no index on ``gpu_id``, and each GPU is
    learned again every minute (its source re-sends it), a scan of every event and process
    second kept (0.6 s a GPU with 2 million process seconds and a million events)."""
    gpu_id = identity.id
    aliases, weak_ids = identity.aliases(), identity.weak_ids()
    known = dict(db.execute(f"select alias, gpu_id from gpu_aliases where alias in "
                            f"({', '.join('?' * len(aliases))})", aliases).fetchall())
    for alias in aliases:
        db.execute("insert into gpu_aliases (alias, gpu_id, first_seen, last_seen) "
                   "values (?, ?, ?, ?) on conflict(alias) do update set "
                   "gpu_id = excluded.gpu_id, last_seen = excluded.last_seen",
                   [alias, gpu_id, ts, ts])
    if all(known.get(alias) == gpu_id for alias in aliases) and not (weak_ids and db.execute(
            f"select 1 from gpus where id in ({', '.join('?' * len(weak_ids))})",
            weak_ids).fetchone()):
        return gpu_id
    for weak in weak_ids:
        for table in GPU_ID_TABLES:
            db.execute(f"update {table} set gpu_id = ? where gpu_id = ?", [gpu_id, weak])
        if weak != gpu_id:
            # A GPU known only by its PCI address (a kernel-log Xid 79) keeps its health
            # when a source names it: the strong row takes it unless it is worse already.
            db.execute("update gpus set (health, health_since, health_evidence, health_clears,"
                       " health_boot_id) = (select w.health, w.health_since, "
                       "w.health_evidence, w.health_clears, w.health_boot_id from gpus w "
                       "where w.id = ?) where id = ? and coalesce(health, 'ok') = 'ok' and "
                       "exists (select 1 from gpus w where w.id = ? and w.uuid is null and "
                       "coalesce(w.health, 'ok') != 'ok')", [weak, gpu_id, weak])
            db.execute("delete from gpus where id = ? and uuid is null", [weak])
    return gpu_id


def note_pci_uuid(db: Database, pci: str, uuid: str, ts: int) -> None:
    """Keep the UUID the kernel log paired with a PCI address (NVRM's "GPU at PCI:… GPU-…"
    line): the kernel log names GPUs by PCI address alone from then on."""
    db.execute("insert into gpu_pci_uuids (pci, uuid, first_seen, last_seen) "
               "values (?, ?, ?, ?) on conflict(pci) do update set uuid = excluded.uuid, "
               "last_seen = excluded.last_seen", [pci, uuid, ts, ts])


def resolve_gpu(db: Database, *, uuid: str | None = None, pci: str | None = None,
                index: int | None = None, minor: int | None = None) -> str | None:
    """The GPU id for whatever name is at hand (strongest first), or None when unknown."""
    if uuid:
        return uuid
    candidates = []
    if pci:
        pci = normalize_pci(pci)
        row = db.execute("select uuid from gpu_pci_uuids where pci = ?", [pci]).fetchone()
        if row:
            return row[0]
    candidates += GpuIdentity(pci_bus_id=pci, index=index, minor=minor).aliases()
    for alias in candidates:
        row = db.execute("select gpu_id from gpu_aliases where alias = ?", [alias]).fetchone()
        if row:
            return row[0]
    if pci:
        return pci
    return GpuIdentity(index=index, minor=minor).id if (index, minor) != (None, None) else None


def minors_of(db: Database, gpu_id: str) -> list[int]:
    """The device minors the GPU is known by (its ``minor:N`` aliases, or its own id)."""
    rows = db.execute("select alias from gpu_aliases where gpu_id = ? and alias like 'minor:%'",
                      [gpu_id]).fetchall()
    return [int(r[0][6:]) for r in rows] + ([int(gpu_id[6:])] if gpu_id.startswith("minor:")
                                            else [])


def gpu_named(db: Database, name: str) -> str:
    """The GPU id a person means by ``name`` (``--gpu`` on the command line, a report's
    subject): a UUID, a PCI address, an index (``0``) or a GPU id. When no GPU is known by
    it: the id such a GPU would have (``index:7``), or ``name`` itself; the caller finds
    nothing under it and says so."""
    name = name.strip()
    if db["gpus"].exists() and db.execute("select 1 from gpus where id = ?", [name]).fetchone():
        return name
    is_pci = ":" in name and not name.startswith(("GPU-", "minor:", "index:"))
    return resolve_gpu(db, uuid=name if name.startswith("GPU-") else None,
                       pci=name if is_pci else None,
                       index=int(name) if name.isdigit() and len(name) <= 4 else None) or name


def pci_and_uuid(db: Database, gpu_id: str | None) -> tuple[str | None, str | None]:
    """The PCI address and UUID a GPU id is known by (for alerts and the CLI)."""
    if not gpu_id:
        return None, None
    uuid = gpu_id if gpu_id.startswith("GPU-") else None
    pci = None
    row = db.execute("select alias from gpu_aliases where gpu_id = ? and alias like 'pci:%'",
                     [gpu_id]).fetchone()
    if row:
        pci = row[0][4:]
    else:
        row = db.execute("select pci from gpu_pci_uuids where uuid = ?", [gpu_id]).fetchone()
        pci = row[0] if row else (gpu_id if ":" in gpu_id and not uuid and
                                  not gpu_id.startswith(("minor:", "index:")) else None)
    return pci, uuid
