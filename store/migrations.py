"""The store's schema, as append-only sqlite-utils migrations (never edit an applied one).

Times are integers: nanoseconds of CLOCK_REALTIME. A process is (pid, start_time).
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from gpuwhy.errors import StoreError


class _Schema(Migrations):
    """The migrations, and a refusal to open a store a newer gpuwhy has migrated: its
    tables may hold columns and meanings this build does not know, and writing to them
    (or pruning them) by the old rules would corrupt what the newer one keeps."""

    def apply(self, db: Database, **kwargs: Any) -> None:
        refuse_newer(db)
        super().apply(db, **kwargs)


migrations = _Schema("gpuwhy")


def newer_schema(db: Database) -> list[str]:
    """The schema steps applied to ``db`` that this build does not know (empty: none; a
    store written by a newer gpuwhy lists its newer steps)."""
    known = {migration.name for migration in migrations._migrations}
    return [applied.name for applied in migrations.applied(db) if applied.name not in known]


def refuse_newer(db: Database) -> None:
    """Raise :class:`StoreError`, naming the file, when a newer gpuwhy has migrated ``db``."""
    newer = newer_schema(db)
    if newer:
        files = db.execute("PRAGMA database_list").fetchall()
        path = next((row[2] for row in files if row[1] == "main"), "") or "in memory"
        raise StoreError(
            f"store {path} was written by a newer gpuwhy: schema steps this build does not know "
            f"({', '.join(newer[:5])}{', ...' if len(newer) > 5 else ''}); run that gpuwhy, "
            "or move the store aside to start a new one")


@migrations()
def m001_core_tables(db: Database) -> None:
    db.table("processes").create({
        "pid": int, "start_time": int, "comm": str, "cmdline": str, "exe": str, "ppid": int,
        "uid": int, "cgroup": str, "tag": str, "first_seen": int, "last_seen": int,
        "exited_at": int,
    }, pk=("pid", "start_time"))
    db.table("gpus").create({
        "id": str, "uuid": str, "pci_bus_id": str, "gpu_index": int, "minor": int,
        "model": str, "driver_version": str, "simulated": int, "first_seen": int,
        "last_seen": int,
    }, pk="id")
    db.table("device_fds").create({
        "pid": int, "start_time": int, "fd": int, "opened_at": int, "path": str,
        "device": str, "minor": int, "scanned": int, "closed_at": int,
    }, pk=("pid", "start_time", "fd", "opened_at"))
    db.table("device_fds").create_index(["closed_at"])
    db.table("gpu_bindings").create({
        "pid": int, "start_time": int, "gpu_id": str, "since": int, "until": int,
        "evidence": str,
    }, pk=("pid", "start_time", "gpu_id", "since"))
    db.table("gpu_bindings").create_index(["gpu_id", "since"])
    db.table("ioctl_counts").create({
        "pid": int, "start_time": int, "path": str, "cmd": int, "device": str, "count": int,
        "updated_at": int,
    }, pk=("pid", "start_time", "path", "cmd"))
    db.table("events").create({
        "id": int, "ts": int, "topic": str, "kind": str, "src": str, "pid": int,
        "start_time": int, "gpu_id": str, "body": str,
    }, pk="id")
    db.table("events").create_index(["ts"])
    db.table("events").create_index(["pid", "start_time", "ts"])
    db.table("gpu_samples").create({
        "gpu_id": str, "ts": int, "gpu_util": float, "mem_util": float, "sm_active": float,
        "tensor_active": float, "dram_active": float, "fb_used_mib": float,
        "power_w": float, "temp_c": float,
    }, pk=("gpu_id", "ts"))
    db.table("incidents").create({
        "id": int, "opened_at": int, "closed_at": int, "kind": str, "severity": str,
        "gpu_id": str, "pid": int, "start_time": int, "title": str, "summary": str,
        "chain": str,
    }, pk="id")
    db.table("incidents").create_index(["opened_at"])
    db.table("source_health").create({
        "source": str, "state": str, "detail": str, "counters": str, "last_seen": int,
    }, pk="source")


# --- probes migrations: name them m1NN_* ---
@migrations()
def m101_decoded_driver_calls(db: Database) -> None:
    db.table("device_fds").add_column("how", str)
    db.table("device_fds").add_column("cloexec", int)
    db.execute("update device_fds set how = case when scanned then 'scan' else 'open' end")
    for column, kind in (("exit_code", int), ("signal", int), ("exe_filename", str)):
        db.table("processes").add_column(column, kind)
    db["ioctl_counts"].drop()
    db.table("driver_call_stats").create({
        "pid": int, "start_time": int, "path": str, "cmd": int, "sub": int, "device": str,
        "op": str, "sub_name": str, "count": int, "errors": int, "latency_sum_ns": int,
        "latency_max_ns": int, "bytes": int, "latency_log2": str, "updated_at": int,
    }, pk=("pid", "start_time", "path", "cmd", "sub"))
    db.table("driver_calls").create({
        "id": int, "ts": int, "pid": int, "start_time": int, "tid": int, "fd": int,
        "path": str, "device": str, "cmd": int, "nr": int, "size": int, "op": str, "sub": int,
        "sub_name": str, "latency_ns": int, "ret": int, "status": int, "status_name": str,
        "arg0": int, "arg1": int, "bytes": int, "version": str, "gpu_ids": str,
        "reasons": str,
    }, pk="id")
    db.table("driver_calls").create_index(["ts"])
    db.table("driver_calls").create_index(["pid", "start_time", "ts"])
    columns = {"pid": int, "start_time": int, "ts": int, "interval_ns": int,
               "worker_processes": int}
    for side in ("own", "workers"):
        for name in ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns",
                     "voluntary_switches", "involuntary_switches", "migrations", "threads"):
            columns[f"{side}_{name}"] = int
    db.table("sched_stats").create(columns, pk=("pid", "start_time", "ts"))

# --- GPU source migrations: name them m2NN_* ---
_M201_SAMPLE_COLUMNS = (
    "gpu_util", "mem_util", "enc_util", "dec_util", "sm_clock_mhz", "mem_clock_mhz",
    "clocks_event_reasons", "pstate", "temp_c", "mem_temp_c", "power_w", "power_limit_w",
    "energy_mj", "power_violation_ns", "thermal_violation_ns", "fb_total_mib", "fb_used_mib",
    "pcie_replays", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s", "ecc_sbe_volatile", "ecc_dbe_volatile", "retired_pages_sbe",
    "retired_pages_dbe", "row_remap_uncorrectable", "row_remap_correctable", "row_remap_failed",
    "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp64_active", "fp32_active", "fp16_active",
)


@migrations()
def m201_gpu_samples_wide(db: Database) -> None:
    """One narrow row per GPU and instant, every field a REAL column (NULL = not reported),
    WITHOUT ROWID so the (gpu_id, ts, instance) key is stored once. ``instance`` is the MIG
    GPU instance ('' for the whole GPU). Rows of the foundation's table are carried over."""
    columns = ", ".join(f"{name} REAL" for name in _M201_SAMPLE_COLUMNS)
    db.execute(f"CREATE TABLE gpu_samples_wide (gpu_id TEXT NOT NULL, ts INTEGER NOT NULL, "
               f"instance TEXT NOT NULL DEFAULT '', {columns}, "
               f"PRIMARY KEY (gpu_id, ts, instance)) WITHOUT ROWID")
    old = ("gpu_util", "mem_util", "sm_active", "tensor_active", "dram_active", "fb_used_mib",
           "power_w", "temp_c")
    db.execute(f"INSERT INTO gpu_samples_wide (gpu_id, ts, {', '.join(old)}) "
               f"SELECT gpu_id, ts, {', '.join(old)} FROM gpu_samples")
    db["gpu_samples"].drop()
    db.execute("ALTER TABLE gpu_samples_wide RENAME TO gpu_samples")
    db.table("gpus").add_column("source", str)
    db.table("gpus").add_column("state", str)
    db.table("gpus").add_column("state_since", int)
    db.execute("CREATE TABLE gpu_processes (gpu_id TEXT NOT NULL, ts INTEGER NOT NULL, "
               "pid INTEGER NOT NULL, start_time INTEGER, used_memory_mib REAL, sm_util REAL, "
               "mem_util REAL, enc_util REAL, dec_util REAL, "
               "PRIMARY KEY (gpu_id, ts, pid)) WITHOUT ROWID")

# --- kernel log and cron migrations: name them m3NN_* ---


@migrations()
def m301_kernel_log_and_cron(db: Database) -> None:
    # A source's read position, written in the same transaction as what it produced.
    db.table("source_cursors").create({
        "source": str, "origin": str, "cursor": str, "boot_id": str, "updated_at": int,
    }, pk="source")
    db.table("kernel_log").create({
        "cursor": str, "ts": int, "raw_ts": int, "boot_id": str, "origin": str, "kind": str,
        "xid": int, "sxid": int, "pci": str, "gpu_id": str, "pid": int, "name": str,
        "gpu_instance": int, "compute_instance": int, "message": str, "details": str,
        "line": str,
    }, pk="cursor")
    db.table("kernel_log").create_index(["ts"])
    db.table("kernel_log").create_index(["gpu_id", "ts"])
    # Kept when the GPU is gone: an Xid 79 GPU no longer answers NVML, but its UUID line stays.
    db.table("gpu_pci_uuids").create({
        "pci": str, "uuid": str, "first_seen": int, "last_seen": int,
    }, pk="pci")
    db.table("cron_jobs").create({
        "ident": str, "origin": str, "file": str, "user": str, "schedule": str,
        "command": str, "next_run": int, "last_run": int, "gpu_action": str, "note": str,
        "updated_at": int,
    }, pk="ident")
    db.table("cron_runs").create({
        "cursor": str, "ts": int, "phase": str, "user": str, "command": str, "job_pid": int,
        "job_start_time": int, "cron_pid": int, "gpu_action": str, "boot_id": str,
        "ended_at": int,
    }, pk="cursor")
    db.table("cron_runs").create_index(["job_pid", "ts"])

# --- correlator migrations: name them m4NN_* ---


@migrations()
def m401_incidents_chains_timelines(db: Database) -> None:
    """Incidents gain dedup, state and settling; their chain links, processes and evidence get
    tables; GPU aliases (minor, PCI, index, UUID -> id) and per-process 1 s timelines."""
    for column, kind in (("dedup_key", str), ("count", int), ("last_seen", int),
                         ("state", str), ("settle_until", int), ("updated_at", int),
                         ("confidence", float), ("details", str), ("alerted_at", int)):
        db.table("incidents").add_column(column, kind)
    db.table("incidents").create_index(["dedup_key", "last_seen"])
    db.table("incidents").create_index(["gpu_id", "opened_at"])
    db.table("incident_links").create({
        "incident_id": int, "seq": int, "kind": str, "ts": int, "summary": str,
        "evidence": str, "confidence": float, "pid": int, "start_time": int, "gpu_id": str,
    }, pk=("incident_id", "seq"))
    db.table("incident_processes").create({
        "incident_id": int, "pid": int, "start_time": int, "role": str,
    }, pk=("incident_id", "pid", "start_time"))
    db.table("incident_processes").create_index(["pid", "start_time"])
    db.table("gpu_aliases").create({
        "alias": str, "gpu_id": str, "first_seen": int, "last_seen": int,
    }, pk="alias")
    db.execute("CREATE TABLE process_seconds (pid INTEGER NOT NULL, start_time INTEGER NOT NULL,"
               " second INTEGER NOT NULL, gpu_id TEXT, ioctls INTEGER, ioctl_ops TEXT, "
               "on_cpu_ms REAL, runqueue_ms REAL, sleep_ms REAL, blocked_ms REAL, "
               "workers_on_cpu_ms REAL, workers_runqueue_ms REAL, workers_blocked_ms REAL, "
               "sm_util REAL, used_memory_mib REAL, "
               "PRIMARY KEY (pid, start_time, second)) WITHOUT ROWID")

# --- rules migrations: name them m5NN_* ---


@migrations()
def m501_rule_findings_and_overrides(db: Database) -> None:
    """Rule findings (one row per finding, from onset to clearing) and operators' per-rule
    overrides: enabled, shadow, and threshold parameters as JSON."""
    db.table("rule_findings").create({
        "finding_id": str, "rule_id": str, "title": str, "severity": str, "state": str,
        "gpu_id": str, "pid": int, "start_time": int, "window_start": int, "window_end": int,
        "evidence": str, "root_cause": str, "fixes": str, "verify": str, "shadow": int,
        "rule_group": str, "first_ts": int, "last_ts": int, "cleared_at": int,
    }, pk="finding_id")
    db.table("rule_findings").create_index(["first_ts"])
    db.table("rule_findings").create_index(["gpu_id", "first_ts"])
    db.table("rule_findings").create_index(["state"])
    db.table("rule_overrides").create({
        "rule_id": str, "enabled": int, "shadow": int, "params": str, "updated_at": int,
    }, pk="rule_id")

# --- store migrations: name them m6NN_* ---


@migrations()
def m601_compact_gpu_samples(db: Database) -> None:
    """GPU samples keyed by a small integer GPU key (``gpus.gpu_key``, assigned by a trigger
    on every insert) and ts first, values as integers in per-field units (store/samples.py):
    a GPU-day of 1 Hz samples shrinks from ~21 MB to a few. Rows are carried over; the view
    ``gpu_samples`` (m603) shows them as before, with the GPU's ids and the fields' units."""
    from gpuwhy.store.samples import STORAGE_V1

    db.execute("INSERT OR IGNORE INTO gpus (id, first_seen, last_seen) "
               "SELECT gpu_id, min(ts), max(ts) FROM gpu_samples GROUP BY gpu_id")
    db.execute("ALTER TABLE gpus ADD COLUMN gpu_key INTEGER")
    db.execute("UPDATE gpus SET gpu_key = rowid")
    db.execute("CREATE UNIQUE INDEX gpus_gpu_key ON gpus (gpu_key)")
    db.execute("CREATE TRIGGER gpus_assign_key AFTER INSERT ON gpus WHEN new.gpu_key IS NULL "
               "BEGIN UPDATE gpus SET gpu_key = (SELECT coalesce(max(gpu_key), 0) + 1 FROM gpus) "
               "WHERE rowid = new.rowid; END")
    columns = ", ".join(f"{s.column} INTEGER" for s in STORAGE_V1)
    db.execute(f"CREATE TABLE gpu_sample_data (ts INTEGER NOT NULL, gpu INTEGER NOT NULL, "
               f"instance TEXT NOT NULL DEFAULT '', {columns}, "
               f"PRIMARY KEY (ts, gpu, instance)) WITHOUT ROWID")
    old = set(db["gpu_samples"].columns_dict)
    carried = [s for s in STORAGE_V1 if s.field in old]
    values = ", ".join(f"CAST(round(s.{s.field} * {s.scale!r}) AS INTEGER)" for s in carried)
    db.execute(f"INSERT INTO gpu_sample_data (ts, gpu, instance, "
               f"{', '.join(s.column for s in carried)}) "
               f"SELECT s.ts, g.gpu_key, s.instance, {values} "
               f"FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id")
    db["gpu_samples"].drop()


@migrations()
def m602_rollups_and_retention(db: Database) -> None:
    """One-minute rollups of the samples (min/mean/max/p95 of gauges, the largest value of
    counters, the OR of bitmasks), the store's own progress marks, the Xid catalogue for the
    views, and the time indexes that let retention delete old rows in small batches."""
    from gpuwhy.store.samples import STORAGE_V1, rollup_columns
    from gpuwhy.xid import xid_info

    columns = ", ".join(f"{c} INTEGER" for s in STORAGE_V1 for c in rollup_columns(s))
    db.execute(f"CREATE TABLE gpu_rollup_data (minute INTEGER NOT NULL, gpu INTEGER NOT NULL, "
               f"instance TEXT NOT NULL DEFAULT '', samples INTEGER NOT NULL, {columns}, "
               f"PRIMARY KEY (minute, gpu, instance)) WITHOUT ROWID")
    db.table("store_state").create({"name": str, "value": int, "updated_at": int}, pk="name")
    known = [xid_info(code) for code in range(1, 256)]
    db.table("xid_codes").insert_all(
        [{"code": x.code, "mnemonic": x.mnemonic, "title": x.title, "severity": x.severity,
          "origin": x.origin, "gpu_reset": int(x.gpu_reset), "reboot": int(x.reboot)}
         for x in known if x.mnemonic != "UNKNOWN"], pk="code")
    db.table("sched_stats").create_index(["ts"], if_not_exists=True)
    db.table("gpu_processes").create_index(["ts"], if_not_exists=True)
    db.table("processes").create_index(["exited_at"], if_not_exists=True)
    db.table("cron_runs").create_index(["ts"], if_not_exists=True)
    if db["process_seconds"].exists():
        db.table("process_seconds").create_index(["second"], if_not_exists=True)


@migrations()
def m603_views(db: Database) -> None:
    """Views for the common questions (store/views.py, docs/schema.md)."""
    from gpuwhy.store.views import VIEWS_V1, create_views

    create_views(db, VIEWS_V1)

# --- deployment migrations: name them m7NN_* ---


@migrations()
def m701_process_owner(db: Database) -> None:
    """Container id, Kubernetes pod uid and systemd unit of a process, from its cgroup path."""
    for column in ("container_id", "pod_uid", "unit"):
        db.table("processes").add_column(column, str)
    db.table("processes").create_index(["pod_uid"])
    db.table("processes").create_index(["container_id"])

# --- cuda migrations: name them m8NN_* ---


@migrations()
def m801_cuda_uprobes(db: Database) -> None:
    """Per-second CUDA API figures of GPU processes and single notable CUDA calls."""
    columns: dict[str, type] = {"pid": int, "start_time": int, "ts": int, "interval_ns": int,
                                "calls": int, "errors": int, "launches": int,
                                "graph_launches": int}
    for direction in ("htod", "dtoh", "dtod", "htoh", "unknown"):
        columns.update({f"{direction}_count": int, f"{direction}_bytes": int})
    for host in ("htod", "dtoh"):
        columns.update({f"{host}_pinned_bytes": int, f"{host}_pageable_bytes": int})
    columns.update({"syncs": int, "sync_blocked_ns": int, "allocs": int, "alloc_bytes": int,
                    "frees": int, "free_bytes": int, "host_allocs": int,
                    "host_alloc_bytes": int, "overhead_ns": int, "traced_since_start": int,
                    "detail": str})
    db.table("cuda_stats").create(columns, pk=("pid", "start_time", "ts"))
    db.table("cuda_stats").create_index(["ts"])
    db.table("cuda_calls").create({
        "id": int, "ts": int, "pid": int, "start_time": int, "tid": int, "api": str,
        "latency_ns": int, "ret": int, "bytes": int, "direction": str, "host": str,
        "reasons": str,
    }, pk="id")
    db.table("cuda_calls").create_index(["ts"])
    db.table("cuda_calls").create_index(["pid", "start_time", "ts"])


@migrations()
def m802_cuda_timeline(db: Database) -> None:
    """A process second also holds its CUDA API figures, where the uprobes are on."""
    for column, kind in (("cuda_launches", int), ("cuda_syncs", int), ("cuda_sync_ms", float),
                         ("cuda_htod_bytes", int), ("cuda_dtoh_bytes", int),
                         ("cuda_pageable_bytes", int), ("cuda_allocs", int),
                         ("cuda_frees", int)):
        db.table("process_seconds").add_column(column, kind)

# --- checks migrations: name them m9NN_* ---


@migrations()
def m901_baselines(db: Database) -> None:
    """Named baselines of `gpuwhy baseline capture`: the run's figures (p5/p50/p95/mean per
    metric, call rates) and its environment, as JSON."""
    db.table("baselines").create({
        "name": str, "created_at": int, "seconds": float, "target": str, "gpu_id": str,
        "environment": str, "figures": str, "watched": str,
    }, pk="name")


# Appended, not placed among the probes migrations above: migrations run in the order they
# are defined, and an applied one is never edited.
@migrations()
def m102_process_events_once(db: Database) -> None:
    """A process event is stored once (a re-sent scan or a second probes process's copy is
    ignored): ``events.dedup_key`` tells it from its process's other events of its kind (its
    meaning: store/writer.py, "process events"), and a partial unique index on (pid,
    start_time, kind, dedup_key) holds it. Copies stored before are deleted, the first kept."""
    db.execute("ALTER TABLE events ADD COLUMN dedup_key TEXT")
    # The same keys as the writer's exec_dedup_key, ONCE_PER_PROCESS and fd_dedup_key.
    db.execute("""UPDATE events SET dedup_key = CASE kind
                    WHEN 'process_exec' THEN json_extract(body, '$.filename')
                    WHEN 'process_forked' THEN ''
                    WHEN 'process_exited' THEN ''
                    ELSE json_extract(body, '$.fd') || '@' || ts END
                  WHERE kind IN ('process_exec', 'process_forked', 'process_exited',
                                 'device_opened', 'device_closed')
                    AND pid IS NOT NULL AND start_time IS NOT NULL""")
    db.execute("""DELETE FROM events WHERE dedup_key IS NOT NULL AND id NOT IN (
                    SELECT min(id) FROM events WHERE dedup_key IS NOT NULL
                    GROUP BY pid, start_time, kind, dedup_key)""")
    db.execute("CREATE UNIQUE INDEX events_once ON events (pid, start_time, kind, dedup_key) "
               "WHERE dedup_key IS NOT NULL")


@migrations()
def m103_one_severity_scale(db: Database) -> None:
    """Severities on the one scale of gpuwhy/severity.py (info < warning < error <
    critical): rows stored under the rule files' older names (``warn``, ``high``) are
    rewritten to ``warning`` and ``error`` in every table with a severity column, so
    ordering, filters and /metrics see one name each (rule findings are not kept in
    ``events``: the writer stores them in ``rule_findings`` only)."""
    from gpuwhy.severity import LEGACY_NAMES

    for table in ("incidents", "rule_findings", "xid_codes"):
        if db[table].exists() and "severity" in db[table].columns_dict:
            for old, new in LEGACY_NAMES.items():
                db.execute(f"UPDATE {table} SET severity = ? WHERE severity = ?", [new, old])


@migrations()
def m104_gpu_health(db: Database) -> None:
    """The GPU health state machine's record (gpuwhy/gpu_health.py): each GPU's current
    state on its ``gpus`` row (``health``, since when, its evidence as JSON, what clears it,
    the boot it was entered in) and every transition in ``gpu_health_history``."""
    for column, kind in (("health", str), ("health_since", int), ("health_evidence", str),
                         ("health_clears", str), ("health_boot_id", str)):
        db.table("gpus").add_column(column, kind)
    db.table("gpu_health_history").create({
        "id": int, "gpu_id": str, "ts": int, "state": str, "previous": str, "cause": str,
        "evidence": str, "clears": str, "boot_id": str,
    }, pk="id")
    db.table("gpu_health_history").create_index(["gpu_id", "ts"])
    db.table("gpu_health_history").create_index(["ts"])


@migrations()
def m105_one_reset_definition(db: Database) -> None:
    """``gpu_reset_history`` re-created from gpuwhy/reset.py, the one definition of a reset:
    a ``reset`` column classes each row (``reset``, ``request``, ``needed``, ``back``), and
    cron runs are only those that reset a GPU (a power-limit job was listed as a reset)."""
    from gpuwhy.store.views import reset_history_sql

    db.execute("DROP VIEW IF EXISTS gpu_reset_history")
    db.execute(reset_history_sql())


@migrations()
def m106_xid_before_start(db: Database) -> None:
    """The last Xid a GPU source showed at its first read, from before gpuwhy started
    (dcgm-exporter's last-Xid gauge; a ``gpu_xid`` event with ``before_start``): the code and
    the time of that first read (the Xid's own time is unknown), for the GPU page."""
    db.execute("ALTER TABLE gpus ADD COLUMN xid_before_start INTEGER")
    db.execute("ALTER TABLE gpus ADD COLUMN xid_before_start_seen INTEGER")


@migrations()
def m107_finding_since_and_processes(db: Database) -> None:
    """A rule finding's ``since`` (when its condition first held: the window columns are the
    evaluation window, which starts a rule's window earlier) and ``processes`` (JSON: every
    process it names, ``[{"pid", "start_time"}]``). Rows stored before keep NULL in both."""
    db.execute("ALTER TABLE rule_findings ADD COLUMN since INTEGER")
    db.execute("ALTER TABLE rule_findings ADD COLUMN processes TEXT")


@migrations()
def m108_incident_lifecycle(db: Database) -> None:
    """The incident lifecycle of gpuwhy/lifecycle.py: ``open`` -> ``acknowledged`` ->
    ``resolved`` with how (``resolution``); ``closed_at`` is when it was resolved; effects
    name their cause incident (``cause_id``). Every change
    and note is a row of ``incident_log``. Rows stored as ``closed`` are ``resolved``: a rule
    finding's or a stall's as ``recovered`` (they closed on clearing), others as ``timeout``
    (they closed once settled)."""
    for column in ("resolution", "acknowledged_by"):
        db.execute(f"ALTER TABLE incidents ADD COLUMN {column} TEXT")
    db.execute("ALTER TABLE incidents ADD COLUMN acknowledged_at INTEGER")
    # An effect (a stall, a death, a rule finding, a later Xid) of an active cause incident
    # is a row of its own, for its detection and dedup, naming the incident it is a link of.
    db.execute("ALTER TABLE incidents ADD COLUMN cause_id INTEGER")
    db.table("incidents").create_index(["cause_id"])
    db.execute("UPDATE incidents SET state = 'resolved', resolution = CASE WHEN kind IN "
               "('rule_finding', 'process_stall') THEN 'recovered' ELSE 'timeout' END "
               "WHERE state = 'closed'")
    db.table("incident_log").create({
        "id": int, "incident_id": int, "ts": int, "action": str, "actor": str, "state": str,
        "resolution": str, "text": str,
    }, pk="id")
    db.table("incident_log").create_index(["incident_id", "ts"])
    db.table("incidents").create_index(["state"])


@migrations()
def m109_reset_history_control_node(db: Database) -> None:
    """``gpu_reset_history`` re-created: a reset or request sent on the control node
    (/dev/nvidiactl, no GPU minor) names the GPUs its process had bound at the call, a row
    per GPU (NULL when none), as the correlator's reset incidents do."""
    from gpuwhy.store.views import reset_history_sql

    db.execute("DROP VIEW IF EXISTS gpu_reset_history")
    db.execute(reset_history_sql())


@migrations()
def m110_incident_feed(db: Database) -> None:
    """The incident feed's cursor (store/feed.py) and the Alertmanager pusher's record
    (store/alertpush.py). ``incident_log`` is re-created with ``id INTEGER PRIMARY KEY
    AUTOINCREMENT``, its rows and ids kept: an id is then never handed out again, even once
    retention deleted the newest rows, so a feed reader's cursor never goes back.
    ``feed_cursors``: a reader's last cursor by name. ``alertmanager_alerts``: each incident
    the pusher keeps sending, with the labels it was first sent with (never changed), when
    it started and ended, its firing sends and the resolved sends still owed."""
    db.execute("CREATE TABLE incident_log_m110 (id INTEGER PRIMARY KEY AUTOINCREMENT, "
               "incident_id INTEGER, ts INTEGER, action TEXT, actor TEXT, state TEXT, "
               "resolution TEXT, text TEXT)")
    db.execute("INSERT INTO incident_log_m110 (id, incident_id, ts, action, actor, state, "
               "resolution, text) SELECT id, incident_id, ts, action, actor, state, "
               "resolution, text FROM incident_log ORDER BY id")
    db.execute("DROP TABLE incident_log")
    db.execute("ALTER TABLE incident_log_m110 RENAME TO incident_log")
    db.table("incident_log").create_index(["incident_id", "ts"])
    db.table("feed_cursors").create({"name": str, "cursor": int, "updated_at": int}, pk="name")
    db.table("alertmanager_alerts").create({
        "incident_id": int, "labels": str, "starts_at": int, "ends_at": int, "fired": int,
        "resolved_left": int, "last_sent": int, "updated_at": int,
    }, pk="incident_id", not_null={"labels", "starts_at", "fired", "resolved_left"},
        defaults={"fired": 0, "resolved_left": 0})


def _add_sample_columns(db: Database, added: tuple, columns: tuple) -> None:
    """Add ``added`` (Stored columns of store/samples.py) to ``gpu_sample_data`` and
    ``gpu_rollup_data`` (rows already there keep their values, NULL in the new columns:
    not reported) and re-create the views ``gpu_samples`` and ``gpu_rollups`` over
    ``columns``, the columns as of the calling migration (frozen: a later one adds its own)."""
    from gpuwhy.store.samples import rollup_columns, rollups_view_sql, samples_view_sql

    for stored in added:
        db.execute(f"ALTER TABLE gpu_sample_data ADD COLUMN {stored.column} INTEGER")
        for column in rollup_columns(stored):
            db.execute(f"ALTER TABLE gpu_rollup_data ADD COLUMN {column} INTEGER")
    for name, sql in (("gpu_samples", samples_view_sql("gpu_samples", columns)),
                      ("gpu_rollups", rollups_view_sql("gpu_rollups", columns))):
        db.execute(f"DROP VIEW IF EXISTS {name}")
        db.execute(sql)


@migrations()
def m111_pcie_link_nvlink_errors_remap_pending(db: Database) -> None:
    """Sample columns for the PCIe link (generation and width, now and at most), the NVLink
    error counters and the pending row remap (store/samples.py ``STORAGE_M111``)."""
    from gpuwhy.store.samples import STORAGE_M111, STORAGE_V1

    _add_sample_columns(db, STORAGE_M111, STORAGE_V1 + STORAGE_M111)


@migrations()
def m112_fabric_state_health(db: Database) -> None:
    """Sample columns for the NVLink fabric's state and health summary (store/samples.py
    ``STORAGE_M112``)."""
    from gpuwhy.store.samples import STORAGE_M111, STORAGE_M112, STORAGE_V1

    _add_sample_columns(db, STORAGE_M112, STORAGE_V1 + STORAGE_M111 + STORAGE_M112)


@migrations()
def m113_process_started_at(db: Database) -> None:
    """``processes.started_at``: when the process started (realtime ns, from its start time).
    A rule's warm-up reads a process's age from it: a job that ran for an hour before
    gpuwhy first saw it is no young process. Rows already there have NULL (not known)."""
    db.table("processes").add_column("started_at", int)


@migrations()
def m114_numa_nodes(db: Database) -> None:
    """``gpus.numa_node``: the NUMA node a GPU's PCIe link is attached to (NULL: not known);
    ``sched_stats.node_on_cpu_ns``: a GPU process's on-CPU time (its threads and its
    workers') per NUMA node, a JSON list indexed by node (NULL on a single-node host)."""
    db.table("gpus").add_column("numa_node", int)
    db.table("sched_stats").add_column("node_on_cpu_ns", str)


@migrations()
def m115_sched_net_rx(db: Database) -> None:
    """``sched_stats.{own,workers}_net_rx_bytes``: bytes the process's threads (its
    workers') received from TCP/IP sockets in the interval, and ``_net_wait_ns``: their
    sleep that ended in such a receive (waiting for the network). NULL where the kernel
    offers neither the sock:sock_recv_length tracepoint nor tcp_cleanup_rbuf."""
    for side in ("own", "workers"):
        db.table("sched_stats").add_column(f"{side}_net_rx_bytes", int)
        db.table("sched_stats").add_column(f"{side}_net_wait_ns", int)


@migrations()
def m116_mig_instances(db: Database) -> None:
    """MIG GPU instances: ``gpu_instances`` holds each (GPU, instance) a source sent samples
    of, with its profile where the source tells it (dcgm-exporter's GPU_I_PROFILE) and
    when it was first and last seen (the writer raises ``last_seen`` about once a minute);
    a few rows a GPU, so the rules find a GPU's instances without scanning samples.
    ``rule_findings.instance`` / ``mig_profile``: the MIG instance a ``scope: instance``
    rule's finding is about ('' for the whole GPU; NULL in rows stored before)."""
    db.execute("CREATE TABLE gpu_instances (gpu_id TEXT NOT NULL, instance TEXT NOT NULL, "
               "profile TEXT NOT NULL DEFAULT '', first_seen INTEGER, last_seen INTEGER, "
               "PRIMARY KEY (gpu_id, instance)) WITHOUT ROWID")
    db.table("rule_findings").add_column("instance", str)
    db.table("rule_findings").add_column("mig_profile", str)


@migrations()
def m117_incident_read_indexes(db: Database) -> None:
    """Indexes on ``incidents.state``, ``incidents.settle_until`` and (``gpu_id``, ``kind``,
    ``opened_at``): the decide stage reads the active incidents and the settling ones once a
    second, and a settling Xid's chain the GPU's last reset, and each read scanned every
    incident the store keeps (of the GPU) (with 10,000 of them, ~3 ms a second, growing
    with the history; most are resolved and settled long ago)."""
    db.table("incidents").create_index(["state"], if_not_exists=True)
    db.table("incidents").create_index(["settle_until"], if_not_exists=True)
    db.table("incidents").create_index(["gpu_id", "kind", "opened_at"], if_not_exists=True)


@migrations()
def m118_device_fds_only(db: Database) -> None:
    """Device opens and closes have one home, ``device_fds`` (an open's row and its
    ``closed_at``): the writer stored each one twice, also as an ``events`` row of topic
    ``fd``, which cost the correlator more than the open itself. An open found only in
    ``events`` is added to ``device_fds`` (the same fields), a close found only there ends
    the open it closed, and the ``fd`` rows are deleted: nothing is lost."""
    db.execute("""INSERT OR IGNORE INTO device_fds (pid, start_time, fd, opened_at, path, device,
                                                  minor, how, scanned, cloexec)
                  SELECT pid, start_time, json_extract(body, '$.fd'), ts,
                         json_extract(body, '$.path'), json_extract(body, '$.device'),
                         json_extract(body, '$.minor'),
                         coalesce(json_extract(body, '$.how'), 'open'),
                         coalesce(json_extract(body, '$.how'), 'open') = 'scan',
                         coalesce(json_extract(body, '$.cloexec'), 0)
                  FROM events
                  WHERE kind = 'device_opened' AND pid IS NOT NULL AND start_time IS NOT NULL
                    AND json_extract(body, '$.fd') IS NOT NULL""")
    closes = """SELECT min(e.ts) FROM events e
                WHERE e.kind = 'device_closed' AND e.pid = device_fds.pid
                  AND e.start_time = device_fds.start_time
                  AND json_extract(e.body, '$.fd') = device_fds.fd
                  AND e.ts >= device_fds.opened_at"""
    db.execute(f"UPDATE device_fds SET closed_at = ({closes}) "
               f"WHERE closed_at IS NULL AND ({closes}) IS NOT NULL")
    db.execute("DELETE FROM events WHERE kind IN ('device_opened', 'device_closed')")


@migrations()
def m119_kernel_log_only(db: Database) -> None:
    """Kernel-log records have one home, ``kernel_log``: the writer also stored the timeline
    kinds' (Xid, SXid, fallen off the bus, driver loaded, ...) as ``events`` rows that
    nothing read. ``kernel_log.driver_version``: the driver version a line names (a driver
    load, a client/kernel mismatch), until now only in those rows' body. A record found only
    in ``events`` is added to ``kernel_log``; the ``kernel_log_record`` rows are deleted."""
    from gpuwhy.wire import json_text

    db.table("kernel_log").add_column("driver_version", str)
    # In Python, not a correlated UPDATE: events has no index on the body's cursor, and
    # these rows are few (kernel lines of a few kinds).
    for ts, gpu_id, body in db.execute("SELECT ts, gpu_id, body FROM events "
                                       "WHERE kind = 'kernel_log_record'").fetchall():
        try:
            record = json.loads(body or "{}")
        except ValueError:
            record = {}
        cursor = record.get("cursor")
        if not isinstance(cursor, str):
            continue
        db.execute("UPDATE kernel_log SET driver_version = ? WHERE cursor = ?",
                   [record.get("driver_version"), cursor])
        db.execute(
            "INSERT OR IGNORE INTO kernel_log (cursor, ts, boot_id, origin, kind, xid, sxid, "
            "pci, gpu_id, pid, name, gpu_instance, compute_instance, message, details, line, "
            "driver_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [cursor, ts, record.get("boot_id"), record.get("origin"),
             record.get("record_kind"), record.get("xid"), record.get("sxid"),
             record.get("pci"), gpu_id, record.get("pid"), record.get("name"),
             record.get("gpu_instance"), record.get("compute_instance"),
             record.get("message"), json_text(record.get("details") or {}, sort_keys=True),
             record.get("line"), record.get("driver_version")])
    db.execute("DELETE FROM events WHERE kind = 'kernel_log_record'")


@migrations()
def m125_engine_samples(db: Database) -> None:
    """Inference engines (probes/engines): ``engine_samples``, one row per scrape of an
    engine's /metrics (the values of ``engine_sample``, one column each, NULL when the
    engine does not report it); ``engine_members``, the processes of an engine's tree that
    hold GPU device files (a vLLM V1 server's EngineCore), so that a GPU process finds the
    engine it serves."""
    columns: dict[str, type] = {"id": int, "ts": int, "engine": str, "endpoint": str,
                                "pid": int, "start_time": int, "version": str, "gpu_ids": str}
    for name in ("requests_running", "requests_waiting", "kv_cache_usage", "batch_size",
                 "preemptions_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
                 "requests_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_mean_s", "tpot_p50_s",
                 "tpot_p95_s", "tpot_mean_s", "e2e_p50_s", "e2e_p95_s", "e2e_mean_s",
                 "queue_p50_s", "queue_p95_s", "queue_mean_s"):
        columns[name] = float
    db.table("engine_samples").create(columns, pk="id")
    db.table("engine_samples").create_index(["ts"])
    db.table("engine_samples").create_index(["pid", "start_time", "ts"])
    db.table("engine_members").create({"pid": int, "start_time": int, "engine_pid": int,
                                       "engine_start_time": int, "since": int},
                                      pk=("pid", "start_time", "engine_pid", "engine_start_time"))


@migrations()
def m120_python_stacks(db: Database) -> None:
    """``python_stacks``: where the Python processes behind a host-side answer spent their
    time (issue #57), one row per (finding, sampled process): the folded stacks that the
    stack sampler aggregated over its window (gpuwhy.pystacks: bounded, escaped), never raw
    samples. Pruned with the events window, as the incidents its findings belong to."""
    db.table("python_stacks").create({
        "finding_id": str, "pid": int, "start_time": int, "gpu_id": str, "rule_id": str,
        "started": int, "ts": int, "interval_ms": int, "samples": int, "final": int,
        "stacks": str, "dropped": str, "error": str,
    }, pk=("finding_id", "pid", "start_time"), if_not_exists=True)
    db.table("python_stacks").create_index(["ts"], if_not_exists=True)
    db.table("python_stacks").create_index(["gpu_id", "ts"], if_not_exists=True)


@migrations()
def m126_finding_relations(db: Database) -> None:
    """``rule_findings.rule_kind`` / ``explains`` / ``scope``: what the answer relates
    findings by (gpuwhy.rules.answer), as the rules sent it, so that a reader whose rule
    files differ from the service's (or lack a rule since removed) ranks the stored
    findings as the service did. NULL in rows stored before: the reader's rules decide."""
    db.table("rule_findings").add_column("rule_kind", str)
    db.table("rule_findings").add_column("explains", str)
    db.table("rule_findings").add_column("scope", str)


@migrations()
def m127_sched_busiest_thread(db: Database) -> None:
    """``sched_stats.own_main_on_cpu_ns``: the on-CPU ns of the GPU process's main thread
    in the interval (a serving engine's loop); ``own_busiest_on_cpu_ns``: of its busiest
    other thread (a frontend's, a tokeniser's); ``workers_busiest_on_cpu_ns``: of its
    workers' busiest thread. One thread on a CPU all the time, which the sums cannot tell.
    NULL in rows stored before."""
    for column in ("own_main_on_cpu_ns", "own_busiest_on_cpu_ns", "workers_busiest_on_cpu_ns"):
        db.table("sched_stats").add_column(column, int)


@migrations()
def m128_finding_unexplained(db: Database) -> None:
    """``rule_findings.unexplained``: for a symptom, why each cause rule that could explain
    it was not established when the rules sent it (JSON list of lines), so the answer read
    from the store says what is missing without the rule files. NULL in rows stored
    before: the reader's rules tell."""
    db.table("rule_findings").add_column("unexplained", str)


@migrations()
def m129_sched_frontend(db: Database) -> None:
    """``sched_stats.frontend_*``: the GPU process's serving frontend, the processes of the
    engine above it that are no children of it (vLLM's API server, SGLang's tokenizer
    manager, TGI's router): ``frontend_on_cpu_ns``, ``frontend_busiest_on_cpu_ns`` (its
    busiest thread's on-CPU ns in the interval: one on a CPU all the time is a saturated
    frontend), ``frontend_threads``, ``frontend_processes``. NULL where none is watched for
    it, and in rows stored before."""
    for column in ("frontend_on_cpu_ns", "frontend_busiest_on_cpu_ns", "frontend_threads",
                   "frontend_processes"):
        db.table("sched_stats").add_column(column, int)


@migrations()
def m130_engine_batch_limit(db: Database) -> None:
    """``engine_samples.batch_limit``: the requests the engine runs at once at most, as its
    command line sets it (vLLM --max-num-seqs, SGLang --max-running-requests, TGI
    --max-batch-size): a closed-loop client exactly at it looks like one below it without.
    NULL when the command line sets none, and in rows stored before."""
    db.table("engine_samples").add_column("batch_limit", float)


@migrations()
def m131_sched_engine_loop(db: Database) -> None:
    """``sched_stats.engine_loop_*``: the GPU process's engine loop, the processes between
    the serving engine above it and it (vLLM V1's EngineCore above its tensor-parallel
    workers, which runs the scheduler's busy loop and holds no GPU): ``engine_loop_on_cpu_ns``,
    ``engine_loop_busiest_on_cpu_ns`` (its busiest thread's on-CPU ns in the interval: one on
    a CPU all the time is a CPU-bound engine), ``engine_loop_threads``,
    ``engine_loop_processes``. NULL where none is watched for it, and in rows stored before."""
    for column in ("engine_loop_on_cpu_ns", "engine_loop_busiest_on_cpu_ns",
                   "engine_loop_threads", "engine_loop_processes"):
        db.table("sched_stats").add_column(column, int)


@migrations()
def m132_process_environment(db: Database) -> None:
    """``processes.env``: the environment variables the probes record of the process (the
    ``probes.environment`` setting: those rules read with env("NAME")), a JSON object of
    the ones it has set; NULL when no sighting read its environment, and in rows stored
    before. Untrusted: the process sets them."""
    db.table("processes").add_column("env", str)
