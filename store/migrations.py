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
# --- end probes migrations ---

# --- GPU source migrations: name them m2NN_* (GPU sources issue) ---
# --- end GPU source migrations ---

# --- kernel log and cron migrations: name them m3NN_* (kernel-log and cron issue) ---
# --- end kernel log and cron migrations ---
