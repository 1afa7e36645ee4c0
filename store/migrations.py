"""The store's schema, as append-only sqlite-utils migrations (never edit an applied one).

Times are integers: nanoseconds of CLOCK_REALTIME. A process is (pid, start_time).
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

migrations = Migrations("gpuwhy")


@migrations()
def m001_core_tables(db: Database) -> None:
    db["processes"].create({
        "pid": int, "start_time": int, "comm": str, "cmdline": str, "exe": str, "ppid": int,
        "uid": int, "cgroup": str, "tag": str, "first_seen": int, "last_seen": int,
        "exited_at": int,
    }, pk=("pid", "start_time"))
    db["gpus"].create({
        "id": str, "uuid": str, "pci_bus_id": str, "gpu_index": int, "minor": int,
        "model": str, "driver_version": str, "simulated": int, "first_seen": int,
        "last_seen": int,
    }, pk="id")
    db["device_fds"].create({
        "pid": int, "start_time": int, "fd": int, "opened_at": int, "path": str,
        "device": str, "minor": int, "scanned": int, "closed_at": int,
    }, pk=("pid", "start_time", "fd", "opened_at"))
    db["device_fds"].create_index(["closed_at"])
    db["gpu_bindings"].create({
        "pid": int, "start_time": int, "gpu_id": str, "since": int, "until": int,
        "evidence": str,
    }, pk=("pid", "start_time", "gpu_id", "since"))
    db["gpu_bindings"].create_index(["gpu_id", "since"])
    db["ioctl_counts"].create({
        "pid": int, "start_time": int, "path": str, "cmd": int, "device": str, "count": int,
        "updated_at": int,
    }, pk=("pid", "start_time", "path", "cmd"))
    db["events"].create({
        "id": int, "ts": int, "topic": str, "kind": str, "src": str, "pid": int,
        "start_time": int, "gpu_id": str, "body": str,
    }, pk="id")
    db["events"].create_index(["ts"])
    db["events"].create_index(["pid", "start_time", "ts"])
    db["gpu_samples"].create({
        "gpu_id": str, "ts": int, "gpu_util": float, "mem_util": float, "sm_active": float,
        "tensor_active": float, "dram_active": float, "fb_used_mib": float,
        "power_w": float, "temp_c": float,
    }, pk=("gpu_id", "ts"))
    db["incidents"].create({
        "id": int, "opened_at": int, "closed_at": int, "kind": str, "severity": str,
        "gpu_id": str, "pid": int, "start_time": int, "title": str, "summary": str,
        "chain": str,
    }, pk="id")
    db["incidents"].create_index(["opened_at"])
    db["source_health"].create({
        "source": str, "state": str, "detail": str, "counters": str, "last_seen": int,
    }, pk="source")


# --- probes migrations: name them m1NN_* (eBPF probes issue) ---
@migrations()
def m101_decoded_driver_calls(db: Database) -> None:
    db["device_fds"].add_column("how", str)
    db["device_fds"].add_column("cloexec", int)
    db.execute("update device_fds set how = case when scanned then 'scan' else 'open' end")
    for column, kind in (("exit_code", int), ("signal", int), ("exe_filename", str)):
        db["processes"].add_column(column, kind)
    db["ioctl_counts"].drop()
    db["driver_call_stats"].create({
        "pid": int, "start_time": int, "path": str, "cmd": int, "sub": int, "device": str,
        "op": str, "sub_name": str, "count": int, "errors": int, "latency_sum_ns": int,
        "latency_max_ns": int, "bytes": int, "latency_log2": str, "updated_at": int,
    }, pk=("pid", "start_time", "path", "cmd", "sub"))
    db["driver_calls"].create({
        "id": int, "ts": int, "pid": int, "start_time": int, "tid": int, "fd": int,
        "path": str, "device": str, "cmd": int, "nr": int, "size": int, "op": str, "sub": int,
        "sub_name": str, "latency_ns": int, "ret": int, "status": int, "status_name": str,
        "arg0": int, "arg1": int, "bytes": int, "version": str, "gpu_ids": str,
        "reasons": str,
    }, pk="id")
    db["driver_calls"].create_index(["ts"])
    db["driver_calls"].create_index(["pid", "start_time", "ts"])
    columns = {"pid": int, "start_time": int, "ts": int, "interval_ns": int,
               "worker_processes": int}
    for side in ("own", "workers"):
        for name in ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns",
                     "voluntary_switches", "involuntary_switches", "migrations", "threads"):
            columns[f"{side}_{name}"] = int
    db["sched_stats"].create(columns, pk=("pid", "start_time", "ts"))
# --- end probes migrations ---

# --- GPU source migrations: name them m2NN_* (GPU sources issue) ---
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
    db["gpus"].add_column("source", str)
    db["gpus"].add_column("state", str)
    db["gpus"].add_column("state_since", int)
    db.execute("CREATE TABLE gpu_processes (gpu_id TEXT NOT NULL, ts INTEGER NOT NULL, "
               "pid INTEGER NOT NULL, start_time INTEGER, used_memory_mib REAL, sm_util REAL, "
               "mem_util REAL, enc_util REAL, dec_util REAL, "
               "PRIMARY KEY (gpu_id, ts, pid)) WITHOUT ROWID")
# --- end GPU source migrations ---

# --- kernel log and cron migrations: name them m3NN_* (kernel-log and cron issue) ---


@migrations()
def m301_kernel_log_and_cron(db: Database) -> None:
    # A source's read position, written in the same transaction as what it produced.
    db["source_cursors"].create({
        "source": str, "origin": str, "cursor": str, "boot_id": str, "updated_at": int,
    }, pk="source")
    db["kernel_log"].create({
        "cursor": str, "ts": int, "raw_ts": int, "boot_id": str, "origin": str, "kind": str,
        "xid": int, "sxid": int, "pci": str, "gpu_id": str, "pid": int, "name": str,
        "gpu_instance": int, "compute_instance": int, "message": str, "details": str,
        "line": str,
    }, pk="cursor")
    db["kernel_log"].create_index(["ts"])
    db["kernel_log"].create_index(["gpu_id", "ts"])
    # Kept when the GPU is gone: an Xid 79 GPU no longer answers NVML, but its UUID line stays.
    db["gpu_pci_uuids"].create({
        "pci": str, "uuid": str, "first_seen": int, "last_seen": int,
    }, pk="pci")
    db["cron_jobs"].create({
        "ident": str, "origin": str, "file": str, "user": str, "schedule": str,
        "command": str, "next_run": int, "last_run": int, "gpu_action": str, "note": str,
        "updated_at": int,
    }, pk="ident")
    db["cron_runs"].create({
        "cursor": str, "ts": int, "phase": str, "user": str, "command": str, "job_pid": int,
        "job_start_time": int, "cron_pid": int, "gpu_action": str, "boot_id": str,
        "ended_at": int,
    }, pk="cursor")
    db["cron_runs"].create_index(["job_pid", "ts"])
# --- end kernel log and cron migrations ---

# --- correlator migrations: name them m4NN_* (correlator issue) ---
# --- end correlator migrations ---

# --- rules migrations: name them m5NN_* (rules issue) ---
# --- end rules migrations ---

# --- store migrations: name them m6NN_* (store issue) ---
# --- end store migrations ---
