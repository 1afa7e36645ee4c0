"""GPU identity join (minor, PCI, index, UUID -> one id) and process<->GPU binding intervals.

One table, ``gpu_aliases``, maps every name a GPU goes by to its :attr:`GpuIdentity.id`:
``minor:N`` (device files), ``pci:dddd:bb:dd`` (kernel log, NVML), ``index:N`` (DCGM/NVML)
and ``uuid:GPU-…``. When a source first names a GPU by a weaker name (a device file opened
before the GPU source said which UUID has minor 0), the rows stored under the weaker id are
re-keyed once the strong one is known. Looking a GPU up by any of its names (for the CLI,
the web view and alerts) is a read: ``gpuwhy.store.queries.resolve_gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlite_utils import Database

from gpuwhy.identity import GpuIdentity, ProcessKey

# Tables whose gpu_id column is re-keyed when a GPU's stronger id becomes known.
_GPU_ID_TABLES = ("gpu_bindings", "events", "kernel_log", "incidents", "incident_links",
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
        for table in _GPU_ID_TABLES:
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


@dataclass(frozen=True)
class Binding:
    """A process held a GPU (``gpu_id`` None: only nvidiactl, GPU not yet known) from
    ``since`` to ``until`` (None: still holds it)."""

    process: ProcessKey
    gpu_id: str | None
    since: int
    until: int | None
    evidence: str


def bound_at(db: Database, gpu_id: str, ts: int, slack_ns: int = 0) -> list[Binding]:
    """Processes that held ``gpu_id`` at ``ts`` (device fds or NVML's process list)."""
    rows = db.execute(
        "select pid, start_time, since, until, evidence from gpu_bindings where gpu_id = ? "
        "and since <= ? and (until is null or until >= ?) order by since",
        [gpu_id, ts + slack_ns, ts - slack_ns]).fetchall()
    found = {ProcessKey(r[0], r[1]): Binding(ProcessKey(r[0], r[1]), gpu_id, r[2], r[3], r[4])
             for r in rows}
    nvml = db.execute(
        "select pid, start_time, min(ts) from gpu_processes where gpu_id = ? and "
        "ts between ? and ? and start_time is not null group by pid, start_time",
        [gpu_id, ts - 5_000_000_000 - slack_ns, ts + slack_ns]).fetchall()
    for pid, start_time, first in nvml:
        key = ProcessKey(pid, start_time)
        found.setdefault(key, Binding(key, gpu_id, first, None, "in NVML's process list"))
    return list(found.values())


def gpu_unknown_at(db: Database, ts: int) -> list[ProcessKey]:
    """Processes holding only nvidiactl at ``ts``: their GPU is not known yet."""
    rows = db.execute(
        "select distinct f.pid, f.start_time from device_fds f where f.device = 'nvidiactl' "
        "and f.opened_at <= ? and (f.closed_at is null or f.closed_at >= ?) and not exists "
        "(select 1 from gpu_bindings b where b.pid = f.pid and b.start_time = f.start_time "
        "and b.since <= ? and (b.until is null or b.until >= ?))", [ts, ts, ts, ts]).fetchall()
    return [ProcessKey(*r) for r in rows]


def gpus_of(db: Database, process: ProcessKey, ts: int) -> list[str]:
    """GPUs ``process`` held at ``ts``."""
    rows = db.execute("select distinct gpu_id from gpu_bindings where pid = ? and start_time = ?"
                      " and since <= ? and (until is null or until >= ?)",
                      [process.pid, process.start_time, ts, ts]).fetchall()
    return [r[0] for r in rows]


def process_with_pid_at(db: Database, pid: int, ts: int) -> ProcessKey | None:
    """The process that had ``pid`` at ``ts`` — never one that reused the pid before or after."""
    for slack in (0, 1_000_000_000):
        row = db.execute(
            "select pid, start_time from processes where pid = ? and first_seen <= ? and "
            "(exited_at is null or exited_at >= ?) order by first_seen desc limit 1",
            [pid, ts + slack, ts - slack]).fetchone()
        if row:
            return ProcessKey(*row)
    return None


def parent_of(db: Database, process: ProcessKey) -> ProcessKey | None:
    """The parent process (exact key) of ``process``, from its ppid and start."""
    row = db.execute("select ppid, first_seen from processes where pid = ? and start_time = ?",
                     [process.pid, process.start_time]).fetchone()
    if not row or not row[0]:
        return None
    return process_with_pid_at(db, row[0], row[1])


def ancestry(db: Database, process: ProcessKey, depth: int = 8) -> list[ProcessKey]:
    """``process`` and its ancestors, nearest first (bounded: pid 1 or ``depth``)."""
    chain = [process]
    while len(chain) < depth:
        parent = parent_of(db, chain[-1])
        if parent is None or parent in chain or parent.pid <= 1:
            break
        chain.append(parent)
    return chain


def proc_identities(proc_root: str = "/proc") -> list[GpuIdentity]:
    """GPUs the driver lists in ``/proc/driver/nvidia/gpus/*/information`` (minor number,
    UUID, bus location); none when the driver is not loaded."""
    found = []
    for info in sorted(Path(proc_root, "driver", "nvidia", "gpus").glob("*/information")):
        try:
            fields = dict(line.split(":", 1) for line in info.read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        minor = fields.get("Device Minor")
        uuid = fields.get("GPU UUID")
        found.append(GpuIdentity(uuid=uuid if uuid and uuid.startswith("GPU-") else None,
                                 pci_bus_id=fields.get("Bus Location") or info.parent.name,
                                 minor=int(minor) if minor and minor.isdigit() else None))
    return found
